package rockspec_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testsrv"
)

const (
	rockName    = "lua-resty-ffi-qrpc"
	rockVersion = "0.1.0-1"
	// What the published rockspec's source.url must name: the tarball of
	// `make dist`, as an asset of the GitHub release of the tag.
	releaseURL = "https://github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/releases/download/v0.1.0/lua-resty-ffi-qrpc-0.1.0.tar.gz"
)

// TestLuarocksInstallFromRocksServer is `luarocks install
// lua-resty-ffi-qrpc` as a user types it, against a real rocks server:
// `make rocks` makes the source and binary rocks, `luarocks-admin
// make_manifest` lays them out, net/http serves them on 127.0.0.1, and
// luarocks installs into a fresh tree, which a real nginx then loads to
// call a real qrpc server. Then `luarocks remove` must leave nothing.
//
// Two servers: one with the source rock alone (what a platform without a
// binary rock sees; luarocks builds it, offline: Go proxy off, empty module
// cache) and one with both rocks, as published, from which luarocks must
// pick the binary rock (Go is not even on PATH).
func TestLuarocksInstallFromRocksServer(t *testing.T) {
	ngxtest.Long(t, "make rocks, then luarocks builds the source rock offline from an empty Go cache")
	root, nginx, dir := prepare(t)
	luarocks := lookPath(t, "luarocks", "apt-get install luarocks")
	admin := lookPath(t, "luarocks-admin", "apt-get install luarocks")

	dist := filepath.Join(dir, "dist")
	run(t, root, nil, 20*time.Minute, "make", "--no-print-directory", "rocks", "DIST_DIR="+dist)
	srcRock := filepath.Join(dist, rockName+"-"+rockVersion+".src.rock")
	binRock := filepath.Join(dist, rockName+"-"+rockVersion+".linux-x86_64.rock")
	tarball := filepath.Join(dist, rockName+"-0.1.0.tar.gz")
	for _, f := range []string{srcRock, binRock, tarball} {
		if !fileExists(f) {
			t.Fatalf("make rocks did not write %s", f)
		}
	}
	checkTarball(t, tarball)

	srv := startServer(t)
	goDirs := dirsWith(os.Getenv("PATH"), "go")

	t.Run("source_rock", func(t *testing.T) {
		rocks := rocksServer(t, admin, filepath.Join(dir, "server-src"), srcRock)
		home := filepath.Join(dir, "home-src")
		gopath := filepath.Join(dir, "gopath-src")
		gocache := strings.TrimSpace(run(t, root, nil, time.Minute, "go", "env", "GOCACHE"))
		env := []string{
			"HOME=" + home,
			// Offline: nothing from the Go proxy, nothing from this
			// machine's module cache, no toolchain download. The build
			// cache holds compiled objects only and keeps this fast.
			"GOFLAGS=-mod=vendor", "GOPROXY=off", "GOTOOLCHAIN=local", "GOWORK=off",
			"GOPATH=" + gopath, "GOMODCACHE=" + filepath.Join(gopath, "pkg", "mod"), "GOCACHE=" + gocache,
		}
		if len(goDirs) == 0 {
			t.Fatal("go is not on PATH: the source rock needs it")
		}
		tree := filepath.Join(dir, "tree-src")
		out := installFrom(t, luarocks, rocks, tree, env)
		if !strings.Contains(out, "go build -buildmode=c-shared") {
			t.Errorf("luarocks did not build the library from the source rock:\n%s", out)
		}
		if got := rocks.fetched(); !slices.Contains(got, "/"+filepath.Base(srcRock)) {
			t.Errorf("rocks server requests %v lack the source rock", got)
		}
		if files := regularFiles(t, gopath); len(files) > 0 {
			t.Errorf("the build fetched Go modules instead of using vendor/: %v", files)
		}
		checkTree(t, nginx, dir, srv, luarocks, tree, env)
	})

	t.Run("binary_rock", func(t *testing.T) {
		rocks := rocksServer(t, admin, filepath.Join(dir, "server-all"), srcRock, binRock)
		var path []string
		for _, d := range filepath.SplitList(os.Getenv("PATH")) {
			if !slices.Contains(goDirs, d) {
				path = append(path, d)
			}
		}
		env := []string{
			"HOME=" + filepath.Join(dir, "home-bin"),
			"PATH=" + strings.Join(path, string(os.PathListSeparator)),
			// The Makefile would fall back to /usr/local/go/bin/go: a
			// build, had luarocks chosen the source rock, must fail.
			"GO=/nonexistent/go",
		}
		if d := dirsWith(strings.Join(path, string(os.PathListSeparator)), "go"); len(d) > 0 {
			t.Fatalf("go still on PATH in %v", d)
		}
		tree := filepath.Join(dir, "tree-bin")
		out := installFrom(t, luarocks, rocks, tree, env)
		if strings.Contains(out, "go build") {
			t.Errorf("luarocks built from source instead of installing the binary rock:\n%s", out)
		}
		if got := rocks.fetched(); !slices.Contains(got, "/"+filepath.Base(binRock)) || slices.Contains(got, "/"+filepath.Base(srcRock)) {
			t.Errorf("rocks server requests %v: want the binary rock and not the source rock", got)
		}
		checkTree(t, nginx, dir, srv, luarocks, tree, env)
	})
}

// checkTarball: the release tarball carries vendor/ and the generated
// code, and neither tests nor build outputs.
func checkTarball(t *testing.T, tarball string) {
	t.Helper()
	out, err := exec.Command("tar", "-tzf", tarball).Output()
	if err != nil {
		t.Fatalf("tar -tzf %s: %v", tarball, err)
	}
	names := strings.Split(strings.TrimSpace(string(out)), "\n")
	top := "lua-resty-ffi-qrpc-0.1.0/"
	for _, want := range []string{"vendor/modules.txt", "qrpc/qrpcpb/qrpc.pb.go", "internal/hostq/qrpc.h", "lua/resty/ffi/qrpc.lua", "Makefile", "rockspec/" + rockName + "-" + rockVersion + ".rockspec"} {
		if !slices.Contains(names, top+want) {
			t.Errorf("tarball lacks %s", want)
		}
	}
	for _, n := range names {
		if !strings.HasPrefix(n, top) {
			t.Errorf("tarball entry outside %s: %s", top, n)
		}
		rel := strings.TrimPrefix(n, top)
		if strings.HasPrefix(rel, "vendor/") {
			continue
		}
		if strings.HasSuffix(n, "_test.go") || strings.Contains(n, "/testdata/") || strings.HasSuffix(n, ".so") ||
			rel == "libffi_qrpc.h" || strings.HasPrefix(rel, "nginx/") || strings.HasPrefix(rel, "bench/") {
			t.Errorf("tarball holds %s, which building does not need", rel)
		}
	}
}

// installFrom runs `luarocks install` against the rocks server into tree
// and checks the installed files and the rockspec luarocks recorded.
func installFrom(t *testing.T, luarocks string, rocks *rocksHTTP, tree string, env []string) string {
	t.Helper()
	// --only-server: the loopback server is the only one luarocks may ask
	// (--server would fall back to luarocks.org for what it lacks).
	out := run(t, "", env, 15*time.Minute, luarocks, "install", "--tree", tree, "--only-server="+rocks.url, rockName)
	t.Logf("luarocks install:\n%s", out)
	for _, f := range []string{
		filepath.Join(tree, "share", "lua", "5.1", "resty", "ffi", "qrpc.lua"),
		filepath.Join(tree, "lib", "lua", "5.1", "libffi_qrpc.so"),
	} {
		if !fileExists(f) {
			t.Fatalf("not installed: %s", f)
		}
	}
	checkHeader(t, filepath.Join(tree, "lib", "luarocks", "rocks-5.1", rockName, rockVersion, "include", "qrpc.h"))
	spec, err := os.ReadFile(filepath.Join(tree, "lib", "luarocks", "rocks-5.1", rockName, rockVersion, rockName+"-"+rockVersion+".rockspec"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(spec, []byte(`url = "`+releaseURL+`"`)) {
		t.Errorf("installed rockspec's source.url is not %s:\n%s", releaseURL, spec)
	}
	return out
}

// checkTree loads the tree in nginx (the module finds the library by
// itself), then removes the rock and checks the tree is empty again but
// for luarocks' own manifest, which no longer names the rock.
func checkTree(t *testing.T, nginx *ngxtest.Nginx, dir string, srv *testsrv.Server, luarocks, tree string, env []string) {
	t.Helper()
	luaRoot := filepath.Join(tree, "share", "lua", "5.1")
	checkFromNginx(t, nginx, dir, srv, install{
		luaRoot:   luaRoot,
		luaFile:   filepath.Join(luaRoot, "resty", "ffi", "qrpc.lua"),
		libFile:   filepath.Join(tree, "lib", "lua", "5.1", "libffi_qrpc.so"),
		configure: "{}",
	})

	run(t, "", env, 2*time.Minute, luarocks, "remove", "--tree", tree, rockName)
	manifest := filepath.Join("lib", "luarocks", "rocks-5.1", "manifest")
	var left []string
	for _, f := range regularFiles(t, tree) {
		if f != manifest {
			left = append(left, f)
		}
	}
	if len(left) > 0 {
		t.Errorf("luarocks remove left files behind in %s: %v", tree, left)
	}
	if m, err := os.ReadFile(filepath.Join(tree, manifest)); err != nil {
		t.Errorf("no manifest after remove: %v", err)
	} else if bytes.Contains(m, []byte(rockName)) {
		t.Errorf("manifest still names %s after remove:\n%s", rockName, m)
	}
	list := run(t, "", env, time.Minute, luarocks, "--tree", tree, "list", "--porcelain")
	if strings.Contains(list, rockName) {
		t.Errorf("luarocks list still shows the rock:\n%s", list)
	}
}

// rocksHTTP is a rocks server: a directory laid out by luarocks-admin,
// served by net/http on a free loopback port, with the paths it was asked
// for recorded.
type rocksHTTP struct {
	url string
	mu  sync.Mutex
	got []string
}

func (r *rocksHTTP) fetched() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func rocksServer(t *testing.T, admin, dir string, rocks ...string) *rocksHTTP {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, r := range rocks {
		b, err := os.ReadFile(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(r)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(t, "", []string{"HOME=" + dir + ".home"}, 2*time.Minute, admin, "make_manifest", dir)
	if !fileExists(filepath.Join(dir, "manifest")) {
		t.Fatalf("luarocks-admin make_manifest wrote no manifest in %s", dir)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rocksHTTP{url: "http://" + l.Addr().String()}
	files := http.FileServer(http.Dir(dir))
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			r.mu.Lock()
			r.got = append(r.got, req.URL.Path)
			r.mu.Unlock()
			files.ServeHTTP(w, req)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(l) }()
	t.Cleanup(func() {
		_ = hs.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("rocks server: %v", err)
		}
	})
	return r
}

// run runs a command with env added to the test's environment and fails
// the test, with its output, when it fails or takes longer than limit.
func run(t *testing.T, dir string, env []string, limit time.Duration, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// dirsWith returns the directories of the PATH-style list that hold name.
func dirsWith(pathList, name string) []string {
	var dirs []string
	for _, d := range filepath.SplitList(pathList) {
		if d == "" {
			continue
		}
		if st, err := os.Stat(filepath.Join(d, name)); err == nil && !st.IsDir() {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// regularFiles lists every non-directory under root, relative to it (none
// when root does not exist).
func regularFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == root {
				return filepath.SkipDir
			}
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
