// Package flavours holds the build scripts of the nginx flavours that no
// Debian package provides; its tests check the pinned source list and the
// verification that fetch.sh applies to every archive.
package flavours

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

type source struct{ name, repo, ref, commit, sha string }

func readSources(t *testing.T, path string) []source {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out []source
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fs := strings.Fields(line)
		if len(fs) != 5 {
			t.Fatalf("sources.txt:%d: want 5 fields, got %d: %q", n, len(fs), line)
		}
		out = append(out, source{fs[0], fs[1], fs[2], fs[3], fs[4]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	hex40 = regexp.MustCompile(`^[0-9a-f]{40}$`)
	hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)
	repo  = regexp.MustCompile(`^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$`)
)

// Every source is pinned by commit and by the reference copy's sha256,
// once, and every source a build script fetches is in the list.
func TestSourcesPinned(t *testing.T) {
	srcs := readSources(t, "sources.txt")
	if len(srcs) == 0 {
		t.Fatal("sources.txt lists no source")
	}
	seen := map[string]bool{}
	for _, s := range srcs {
		if seen[s.name] {
			t.Errorf("%s listed twice", s.name)
		}
		seen[s.name] = true
		if !repo.MatchString(s.repo) {
			t.Errorf("%s: repository %q is not owner/name", s.name, s.repo)
		}
		if !hex40.MatchString(s.commit) {
			t.Errorf("%s: commit %q is not 40 hex digits", s.name, s.commit)
		}
		if !hex64.MatchString(s.sha) {
			t.Errorf("%s: sha256 %q is not 64 hex digits", s.name, s.sha)
		}
	}
	// The names a script fetches: its names=(...) list and the arguments
	// of its fetch.sh lines.
	namesRe := regexp.MustCompile(`(?s)names=\(([^)]*)\)`)
	fetchRe := regexp.MustCompile(`fetch\.sh" "\$SRC/dl" ([^\n]+)`)
	for _, script := range []string{"build-openresty.sh", "build-resty-ffi.sh"} {
		b, err := os.ReadFile(script)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, m := range namesRe.FindAllStringSubmatch(string(b), -1) {
			names = append(names, strings.Fields(m[1])...)
		}
		for _, m := range fetchRe.FindAllStringSubmatch(string(b), -1) {
			if !strings.Contains(m[1], "${names[@]}") {
				names = append(names, strings.Fields(m[1])...)
			}
		}
		if len(names) == 0 {
			t.Errorf("%s fetches nothing that this test can see", script)
		}
		for _, n := range names {
			if !seen[n] {
				t.Errorf("%s fetches %s, which sources.txt does not pin", script, n)
			}
		}
	}
}

func run(t *testing.T, env []string, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// thirdparty returns the offline mirror of the archives (THIRDPARTY, as CI
// sets it), or skips.
func thirdparty(t *testing.T) string {
	dir := os.Getenv("THIRDPARTY")
	if dir == "" {
		t.Skip("THIRDPARTY is not set: no offline copy of the archives to verify")
	}
	return dir
}

// fetch.sh accepts each pinned archive of the mirror and refuses a damaged
// copy, and another source's archive under a pinned name.
func TestFetchVerifies(t *testing.T) {
	tp := thirdparty(t)
	srcs := readSources(t, "sources.txt")
	fetch, _ := filepath.Abs("fetch.sh")
	for _, s := range srcs {
		if _, err := os.Stat(filepath.Join(tp, s.name+".tar.gz")); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		out, err := run(t, []string{"THIRDPARTY=" + tp}, fetch, t.TempDir(), s.name)
		if err != nil || !strings.Contains(out, "commit "+s.commit) {
			t.Errorf("%s: fetch.sh: %v\n%s", s.name, err, out)
		}
	}

	bad := t.TempDir()
	victim := srcs[0]
	b, err := os.ReadFile(filepath.Join(tp, victim.name+".tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x55
	if err := os.WriteFile(filepath.Join(bad, victim.name+".tar.gz"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, []string{"THIRDPARTY=" + bad}, fetch, t.TempDir(), victim.name)
	if err == nil || !strings.Contains(out, "damaged") {
		t.Errorf("a damaged %s was accepted: %v\n%s", victim.name, err, out)
	}

	other := srcs[1]
	b, err = os.ReadFile(filepath.Join(tp, other.name+".tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, victim.name+".tar.gz"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, []string{"THIRDPARTY=" + bad}, fetch, t.TempDir(), victim.name)
	if err == nil || !strings.Contains(out, other.commit) || !strings.Contains(out, victim.commit) {
		t.Errorf("%s's archive was accepted as %s: %v\n%s", other.name, victim.name, err, out)
	}
}

// The stamp that decides whether a build is reused changes with the source
// list and with the build script.
func TestStampFollowsInputs(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"sources.txt", "fetch.sh", "stamp.sh", "build-openresty.sh", "build-resty-ffi.sh"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	stamp := func(flavour string) string {
		out, err := run(t, nil, filepath.Join(dir, "stamp.sh"), flavour)
		if err != nil {
			t.Fatalf("stamp.sh %s: %v\n%s", flavour, err, out)
		}
		return strings.TrimSpace(out)
	}
	or0, rf0 := stamp("openresty"), stamp("resty-ffi")
	if or0 == rf0 || !hex64.MatchString(or0) {
		t.Fatalf("stamps %q and %q", or0, rf0)
	}
	appendTo := func(f string) {
		fh, err := os.OpenFile(filepath.Join(dir, f), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = fh.WriteString("# changed\n")
		_ = fh.Close()
	}
	appendTo("build-openresty.sh")
	or1 := stamp("openresty")
	if or1 == or0 || stamp("resty-ffi") != rf0 {
		t.Errorf("a change of build-openresty.sh: openresty %s -> %s, resty-ffi must stay %s", or0, or1, rf0)
	}
	appendTo("sources.txt")
	if stamp("openresty") == or1 || stamp("resty-ffi") == rf0 {
		t.Error("a change of sources.txt left a stamp as it was")
	}
}
