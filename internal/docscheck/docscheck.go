// Package docscheck keeps the documentation true to the tree: the README's
// length, every relative link and anchor, no development history in text
// a reader meets, every public Lua function and option documented, and
// no include or import under internal/ or qrpc/ that leaves its floor.
// `make lint` runs it through cmd/docscheck.
package docscheck

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Problem is one finding, printed as file:line: message.
type Problem struct {
	File string
	Line int
	Msg  string
}

func (p Problem) String() string {
	if p.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg)
	}
	return fmt.Sprintf("%s: %s", p.File, p.Msg)
}

// MaxReadmeLines caps README.md: it is the quick manual, docs/ the reference.
const MaxReadmeLines = 500

// ReadmeLength checks README.md's line count.
func ReadmeLength(root string) []Problem {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		return []Problem{{File: "README.md", Msg: err.Error()}}
	}
	n := bytes.Count(b, []byte("\n"))
	if len(b) > 0 && b[len(b)-1] != '\n' {
		n++
	}
	if n > MaxReadmeLines {
		return []Problem{{File: "README.md", Msg: fmt.Sprintf("%d lines; at most %d (move reference material to docs/)", n, MaxReadmeLines)}}
	}
	return nil
}

// Files lists the tree's files as git sees them (tracked, and new files not
// ignored), relative to root.
func Files(root string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			continue // deleted in the work tree
		}
		files = append(files, f)
	}
	sort.Strings(files)
	return files, nil
}

var (
	linkRe    = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refDefRe  = regexp.MustCompile(`(?m)^\s*\[[^\]]+\]:\s*(\S+)`)
	headingRe = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	anchorRe  = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	fenceRe   = regexp.MustCompile("^\\s*(```|~~~)")
)

// Slug turns a heading into its anchor as GitHub does: lower case, markup
// and punctuation dropped (except '-' and '_'), spaces to '-'.
func Slug(h string) string {
	h = regexp.MustCompile("`|\\*\\*|\\*|__").ReplaceAllString(h, "")
	h = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(h, "$1")
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_':
			b.WriteRune(r)
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case r > 127 && !strings.ContainsRune("→←↔×–—…·’‘“”", r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// proseLines calls f with each line of a markdown text that is outside
// fenced code blocks, and its line number.
func proseLines(text string, f func(n int, line string)) {
	inFence := false
	for i, line := range strings.Split(text, "\n") {
		if fenceRe.MatchString(line) {
			inFence = !inFence
			continue
		}
		if !inFence {
			f(i+1, line)
		}
	}
}

// Anchors returns the anchors a markdown file defines.
func Anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	proseLines(text, func(_ int, line string) {
		for _, m := range anchorRe.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		m := headingRe.FindStringSubmatch(line)
		if m == nil {
			return
		}
		s := Slug(m[2])
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	})
	return out
}

// Links checks every relative link and anchor of the markdown files.
func Links(root string, files []string) []Problem {
	var probs []Problem
	anchors := map[string]map[string]bool{}
	anchorsOf := func(rel string) (map[string]bool, error) {
		if a, ok := anchors[rel]; ok {
			return a, nil
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return nil, err
		}
		a := Anchors(string(b))
		anchors[rel] = a
		return a, nil
	}
	for _, f := range files {
		if !strings.HasSuffix(f, ".md") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			probs = append(probs, Problem{File: f, Msg: err.Error()})
			continue
		}
		proseLines(string(b), func(n int, line string) {
			var targets []string
			for _, m := range linkRe.FindAllStringSubmatch(stripCode(line), -1) {
				targets = append(targets, m[1])
			}
			for _, m := range refDefRe.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
			}
			for _, t := range targets {
				if msg := checkTarget(root, f, t, anchorsOf); msg != "" {
					probs = append(probs, Problem{File: f, Line: n, Msg: msg})
				}
			}
		})
	}
	return probs
}

// stripCode drops inline code spans, whose brackets are not links.
func stripCode(line string) string {
	return regexp.MustCompile("`[^`]*`").ReplaceAllString(line, "")
}

func checkTarget(root, from, t string, anchorsOf func(string) (map[string]bool, error)) string {
	if regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`).MatchString(t) {
		return "" // http:, https:, mailto:
	}
	path, frag, _ := strings.Cut(t, "#")
	rel := from
	if path != "" {
		rel = filepath.Clean(filepath.Join(filepath.Dir(from), path))
		if strings.HasPrefix(rel, "..") {
			return fmt.Sprintf("link %q leaves the repository", t)
		}
		st, err := os.Stat(filepath.Join(root, rel))
		if err != nil {
			return fmt.Sprintf("link %q: %s does not exist", t, rel)
		}
		if st.IsDir() || frag == "" {
			return ""
		}
	}
	if frag == "" {
		return ""
	}
	if !strings.HasSuffix(rel, ".md") {
		return "" // anchors of source files are line numbers GitHub makes
	}
	a, err := anchorsOf(rel)
	if err != nil {
		return fmt.Sprintf("link %q: %v", t, err)
	}
	if !a[frag] {
		return fmt.Sprintf("link %q: no anchor #%s in %s", t, frag, rel)
	}
	return ""
}

// historyRes are the phrases that tell development history instead of how
// things are: a reader of the tree meets the project as it is; git log
// keeps the story.
var historyRes = []*regexp.Regexp{
	regexp.MustCompile(`(?i)\bsessions? [0-9]+`),
	regexp.MustCompile(`(?i)\bsession [0-9]+'s\b`),
	regexp.MustCompile(`(?i)\bthis[ ]session\b`),
	regexp.MustCompile(`(?i)\bsessions? (ago|before|earlier|later)\b`),
	regexp.MustCompile(`(?i)\b(in|on|of) (an|the) (earlier|previous|last) session\b`),
	regexp.MustCompile(`(?i)\bearlier runs? (gave|measured|showed|took|found|had)\b`),
	regexp.MustCompile(`(?i)\bwhen this line was written\b`),
	regexp.MustCompile(`(?i)\bthe previous (design|build|version|code)\b`),
	regexp.MustCompile(`(?i)\bissues? #?[0-9]+\b`),
	regexp.MustCompile(`(?i)\b(fixes|closes|see) #[0-9]+\b`),
}

// skipHistory are files the history rule does not read: generated code,
// measured output, test inputs, and this package (which spells the
// phrases out).
func skipHistory(f string) bool {
	switch {
	case strings.HasSuffix(f, ".pb.go"), strings.HasSuffix(f, ".protoset"),
		strings.HasPrefix(f, "bench/results."), f == "go.sum", f == "go.mod",
		strings.Contains(f, "/testdata/"), strings.HasPrefix(f, "internal/docscheck/"):
		return true
	}
	return false
}

// History finds history phrases in every text file of the tree.
func History(root string, files []string) []Problem {
	var probs []Problem
	for _, f := range files {
		if skipHistory(f) {
			continue
		}
		fh, err := os.Open(filepath.Join(root, f))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<16), 1<<22)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if n == 1 && strings.ContainsRune(line, 0) {
				break // binary
			}
			for _, re := range historyRes {
				if m := re.FindString(line); m != "" {
					probs = append(probs, Problem{File: f, Line: n, Msg: fmt.Sprintf("history in the tree (%q): say how things are; git log keeps the story", m)})
					break
				}
			}
		}
		_ = fh.Close()
	}
	return probs
}
