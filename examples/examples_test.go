// Package examples runs every nginx.conf of this directory against the
// demo qrpc server, as a user would after replacing its placeholders, and
// checks each request the file documents with "# try:".
package examples

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/dnstest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
)

// A documented request: "# try: curl ..." and the lines after it.
type try struct {
	line     int
	method   string
	url      string
	headers  [][2]string
	body     string
	status   int
	expect   string   // the answer's first line
	contains []string // lines that must be somewhere in the answer
	// tcp: a "# tcp: <line>" of a stream {} example: the line sent on a
	// TCP connection to the example's port; expect is the line answered
	tcp   string
	isTCP bool
	// sni: a "# tls: <server name>" of a stream {} example: a TLS
	// connection to the example's port with that server name; expect is
	// the first line the backend it reaches sends
	sni   string
	isTLS bool
}

var wordRe = regexp.MustCompile(`'[^']*'|\S+`)

// parseTries reads the "# try:", "# expect:", "# status:" and
// "# contains:" lines of an example.
func parseTries(t *testing.T, name, text string) []*try {
	t.Helper()
	var out []*try
	for i, line := range strings.Split(text, "\n") {
		switch {
		case line == "# tcp:" || strings.HasPrefix(line, "# tcp: "):
			out = append(out, &try{line: i + 1, status: 200, isTCP: true,
				tcp: strings.TrimPrefix(strings.TrimPrefix(line, "# tcp:"), " ")})
		case strings.HasPrefix(line, "# tls: "):
			out = append(out, &try{line: i + 1, status: 200, isTLS: true,
				sni: strings.TrimPrefix(line, "# tls: ")})
		case strings.HasPrefix(line, "# try: "):
			tr := &try{line: i + 1, method: "GET", status: 200}
			words := wordRe.FindAllString(strings.TrimPrefix(line, "# try: "), -1)
			if len(words) == 0 || words[0] != "curl" {
				t.Fatalf("%s:%d: a try is a curl command", name, i+1)
			}
			for j := 1; j < len(words); j++ {
				w := strings.Trim(words[j], "'")
				switch words[j] {
				case "-s":
				case "-H":
					j++
					k, v, _ := strings.Cut(strings.Trim(words[j], "'"), ":")
					tr.headers = append(tr.headers, [2]string{k, strings.TrimSpace(v)})
				case "--data-binary":
					j++
					tr.method, tr.body = "POST", strings.Trim(words[j], "'")
				default:
					if !strings.HasPrefix(w, "http://") {
						t.Fatalf("%s:%d: curl argument %q is not understood by the test", name, i+1, w)
					}
					tr.url = w
				}
			}
			out = append(out, tr)
		case len(out) == 0:
		case strings.HasPrefix(line, "# expect: "):
			out[len(out)-1].expect = strings.TrimPrefix(line, "# expect: ")
		case strings.HasPrefix(line, "# status: "):
			n, err := strconv.Atoi(strings.TrimPrefix(line, "# status: "))
			if err != nil {
				t.Fatalf("%s:%d: %v", name, i+1, err)
			}
			out[len(out)-1].status = n
		case strings.HasPrefix(line, "# contains: "):
			out[len(out)-1].contains = append(out[len(out)-1].contains, strings.TrimPrefix(line, "# contains: "))
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s documents no request (# try:, # tcp: or # tls:)", name)
	}
	for _, tr := range out {
		if tr.expect == "" {
			t.Fatalf("%s:%d: a try without # expect:", name, tr.line)
		}
	}
	return out
}

// setup is what every example runs against: the demo server (two, on
// 127.0.0.1 and 127.0.0.2, for the pool), a DNS server naming both, and a
// directory laid out as a checkout.
type setup struct {
	ng      *ngxtest.Nginx
	root    string // the repository
	co      string // the stand-in checkout: lua/, libffi_qrpc.so, demo/
	addr    string // the demo server, 127.0.0.1:port
	port    int    // its port, also on 127.0.0.2
	dnsName string
	dns     *dnstest.Server
}

func openUp(t *testing.T, dir string) {
	// nginx workers drop to www-data/nobody when the test runs as root.
	for d := dir; d != os.TempDir() && d != "/" && d != "."; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func newSetup(t *testing.T) *setup {
	t.Helper()
	ng, err := ngxtest.Find()
	if err != nil {
		t.Skip("no nginx with Lua here:", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	s := &setup{ng: ng, root: root, co: filepath.Join(t.TempDir(), "checkout")}
	for _, d := range []string{"demo/run/certs", "lua"} {
		if err := os.MkdirAll(filepath.Join(s.co, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	openUp(t, s.co)
	// The module, with the library beside its Lua root (OpenResty's
	// layout) and in the checkout's root.
	if err := exec.Command("cp", "-r", filepath.Join(root, "lua", "resty"), filepath.Join(s.co, "lua")).Run(); err != nil {
		t.Fatal(err)
	}
	// Copied, not linked: the workers' user may not read the repository.
	if err := exec.Command("cp", "-r", filepath.Join(root, "demo", "proto"), filepath.Join(s.co, "demo")).Run(); err != nil {
		t.Fatal(err)
	}
	lib := library(t, root)
	for _, dst := range []string{filepath.Join(s.co, "libffi_qrpc.so"), filepath.Join(s.co, "lua", "libffi_qrpc.so")} {
		if out, err := exec.Command("cp", lib, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
	}

	bin := ngxtest.DemoServer(t, root)
	s.port = ngxtest.FreePort(t)
	s.addr = fmt.Sprintf("127.0.0.1:%d", s.port)
	certs := filepath.Join(s.co, "demo", "run", "certs")
	for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		startServer(t, bin, fmt.Sprintf("%s:%d", ip, s.port), fmt.Sprintf("127.0.0.1:%d", ngxtest.FreePort(t)), certs)
	}
	s.dnsName = "qrpc.examples.test"
	s.dns = dnstest.Start(t, s.dnsName+".")
	s.dns.Set("127.0.0.1", "127.0.0.2")
	return s
}

// library is the libffi_qrpc.so the tests load: QRPC_TEST_LIB (the flavour
// targets pass it), the checkout's (make test builds it first), or one
// built here.
func library(t *testing.T, root string) string {
	if lib := os.Getenv("QRPC_TEST_LIB"); lib != "" {
		return lib
	}
	if lib := filepath.Join(root, "libffi_qrpc.so"); fileExists(lib) {
		return lib
	}
	lib := filepath.Join(t.TempDir(), "libffi_qrpc.so")
	goBuild(t, root, "-buildmode=c-shared", "-o", lib, "./ffi")
	return lib
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func goBuild(t *testing.T, root string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"build", "-trimpath"}, args...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", args, err, out)
	}
}

// startServer runs the demo server until the test ends.
func startServer(t *testing.T, bin, addr, mtls, certs string) {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := exec.Command(bin, "-addr", addr, "-mtls-addr", mtls, "-certs-dir", certs, "-ready-file", ready)
	log := filepath.Join(t.TempDir(), "server.log")
	fh, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = fh, fh
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = fh.Close()
	})
	if !testwait.For(30*time.Second, func() bool { return fileExists(ready) }) {
		b, _ := os.ReadFile(log)
		t.Fatalf("the demo server on %s did not get ready:\n%s", addr, b)
	}
}

// render replaces the placeholders the example documents and returns
// the config and the port nginx listens on.
func (s *setup) render(t *testing.T, text string) (string, int) {
	port := ngxtest.FreePort(t)
	var b strings.Builder
	b.WriteString(s.ng.MainConf())
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "load_module ") {
			continue // the build's own come first
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	conf := b.String()
	pkg := regexp.MustCompile(`lua_package_path "([^"]*);;";`)
	conf = pkg.ReplaceAllStringFunc(conf, func(m string) string {
		first := pkg.FindStringSubmatch(m)[1]
		return `lua_package_path "` + s.ng.PackagePath(first) + `";`
	})
	r := strings.NewReplacer(
		"/path/to/lua-resty-ffi-qrpc", s.co,
		"/usr/local/openresty/site/lualib", filepath.Join(s.co, "lua"),
		"/etc/qrpc/ca.pem", filepath.Join(s.co, "demo", "run", "certs", "ca.pem"),
		"qrpc.example.internal:8443", fmt.Sprintf("%s:%d", s.dnsName, s.port),
		"127.0.0.53:53", s.dns.Addr,
		"127.0.0.1:8443", s.addr,
		"listen 8080;", fmt.Sprintf("listen 127.0.0.1:%d;", port),
		// the backends of a stream example
		"127.0.0.1:8081", fmt.Sprintf("127.0.0.1:%d", ngxtest.FreePort(t)),
		"127.0.0.1:8082", fmt.Sprintf("127.0.0.1:%d", ngxtest.FreePort(t)),
	)
	conf = r.Replace(conf)
	// An example written for an installed module has no lua_package_path:
	// here the module is in the stand-in checkout.
	if !strings.Contains(conf, "lua_package_path") {
		conf = strings.Replace(conf, "\nhttp {\n", "\nhttp {\n    lua_package_path \""+s.ng.PackagePath(filepath.Join(s.co, "lua", "?.lua"))+"\";\n", 1)
	}
	return conf, port
}

// nginx runs conf until the test ends; it returns the error log's path.
func (s *setup) nginx(t *testing.T, conf string, port int) string {
	t.Helper()
	prefix := t.TempDir()
	// a build with its own prefix writes logs/ under -p
	if err := os.MkdirAll(filepath.Join(prefix, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	openUp(t, prefix)
	confPath := filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	errLog := filepath.Join(prefix, "error.log")
	pidFile := filepath.Join(prefix, "nginx.pid")
	args := []string{"-p", prefix, "-c", confPath, "-e", errLog, "-g", "pid " + pidFile + ";"}
	if out, err := s.ng.Command(args...).CombinedOutput(); err != nil {
		b, _ := os.ReadFile(errLog)
		t.Fatalf("nginx: %v\n%s\n%s\nconfig:\n%s", err, out, b, conf)
	}
	pid := 0
	t.Cleanup(func() {
		if pid == 0 {
			return
		}
		_ = syscall.Kill(pid, syscall.SIGQUIT)
		if !testwait.For(10*time.Second, func() bool { return syscall.Kill(pid, 0) != nil }) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("nginx %d did not quit within 10 s", pid)
		}
	})
	testwait.For(5*time.Second, func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	if pid == 0 {
		t.Fatal("nginx wrote no pid file")
	}
	testwait.Until(t, fmt.Sprintf("nginx listens on %d", port), 10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	return errLog
}

func (tr *try) do(t *testing.T, port int) (int, string) {
	t.Helper()
	if tr.isTCP {
		return tr.doTCP(t, port)
	}
	if tr.isTLS {
		return tr.doTLS(t, port)
	}
	url := strings.Replace(tr.url, "127.0.0.1:8080", fmt.Sprintf("127.0.0.1:%d", port), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, tr.method, url, strings.NewReader(tr.body))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range tr.headers {
		req.Header.Set(h[0], h[1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("line %d: %v", tr.line, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// doTCP sends a "# tcp:" line on a connection of its own and returns
// the answer line (status 200: a line came).
func (tr *try) doTCP(t *testing.T, port int) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second)
	if err != nil {
		t.Fatalf("line %d: %v", tr.line, err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, tr.tcp+"\n"); err != nil {
		t.Fatalf("line %d: %v", tr.line, err)
	}
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("line %d: %q: %v", tr.line, tr.tcp, err)
	}
	return 200, answer
}

// doTLS opens a TLS connection with the try's server name and returns
// the first line the server at the other end sends (status 200: a line
// came). The backends use the demo's certificate, for localhost: the
// client checks the chain, not the name, which routes and does not match.
func (tr *try) doTLS(t *testing.T, port int) (int, string) {
	t.Helper()
	d := &net.Dialer{Timeout: 10 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{
		ServerName:         tr.sni,
		InsecureSkipVerify: true, //nolint:gosec // the name routes; the test checks which backend answers
	})
	if err != nil {
		t.Fatalf("line %d: TLS to %s: %v", tr.line, tr.sni, err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("line %d: %q: %v", tr.line, tr.sni, err)
	}
	return 200, answer
}

// needsStreamLua: a stream {} example runs only on an nginx with
// ngx_stream_lua (the openresty flavour; Debian's nginx has none).
func needsStreamLua(text string) bool { return strings.Contains(text, "\nstream {") }

func hasLine(body, want string) bool {
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for sc.Scan() {
		if sc.Text() == want {
			return true
		}
	}
	return false
}

var badLog = regexp.MustCompile(`\[(error|alert|crit|emerg)\]`)

func TestExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nginx and the demo server")
	}
	s := newSetup(t)
	files, err := filepath.Glob("*.conf")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if needsStreamLua(string(b)) && !s.ng.StreamLua {
				t.Skipf("%s: %s needs ngx_stream_lua (run it with QRPC_NGINX=openresty: make test-openresty)", s.ng.NoStreamLua, f)
			}
			tries := parseTries(t, f, string(b))
			for _, tr := range tries {
				tr.expect = strings.ReplaceAll(tr.expect, "127.0.0.1:8443", s.addr)
				for i, c := range tr.contains {
					tr.contains[i] = strings.ReplaceAll(c, "127.0.0.1:8443", s.addr)
				}
			}
			conf, port := s.render(t, string(b))
			errLog := s.nginx(t, conf, port)
			for _, tr := range tries {
				// A "contains" line may wait for the workers' metrics
				// flush (once a second, and the log phase may end after
				// the answer): asked again until it shows, bounded.
				var status int
				var body, first, missing string
				testwait.For(10*time.Second, func() bool {
					status, body = tr.do(t, port)
					first, _, _ = strings.Cut(body, "\n")
					missing = ""
					for _, c := range tr.contains {
						if !hasLine(body, c) {
							missing = c
						}
					}
					return missing == ""
				})
				if status != tr.status || first != tr.expect || missing != "" {
					t.Errorf("%s:%d: %s %s: got %d %q, want %d %q (and the line %q)",
						f, tr.line, tr.method, tr.url, status, body, tr.status, tr.expect, missing)
				}
			}
			logs, _ := os.ReadFile(errLog)
			for _, line := range strings.Split(string(logs), "\n") {
				if badLog.MatchString(line) {
					t.Errorf("error.log: %s", line)
				}
			}
		})
	}
}

// The test reads the documented requests the way the README describes
// them; a try it cannot read fails instead of being skipped.
func TestParseTries(t *testing.T) {
	tries := parseTries(t, "x.conf", "# try: curl -s -H 'Content-Type: application/json' --data-binary '{\"a\":1}' 'http://127.0.0.1:8080/v1/x'\n"+
		"# status: 400\n# expect: {\"error\":\"e\"}\n# contains: line two\n")
	if tt := parseTries(t, "s.conf", "# tcp: greet x\n# expect: 0 Hello x!\n# tcp:\n# expect: ERR\n"); len(tt) != 2 ||
		!tt[0].isTCP || tt[0].tcp != "greet x" || tt[0].expect != "0 Hello x!" || !tt[1].isTCP || tt[1].tcp != "" {
		t.Fatalf("tcp tries: %+v %+v", tt[0], tt[len(tt)-1])
	}
	tr := tries[0]
	if tr.method != "POST" || tr.body != `{"a":1}` || tr.url != "http://127.0.0.1:8080/v1/x" || tr.status != 400 ||
		tr.expect != `{"error":"e"}` || len(tr.contains) != 1 || len(tr.headers) != 1 || tr.headers[0][0] != "Content-Type" {
		t.Fatalf("%+v", tr)
	}
}

// exampleBody is an example without its leading comment block: the part a
// document shows.
func exampleBody(text string) string {
	lines := strings.Split(text, "\n")
	i := 0
	for i < len(lines) && (strings.HasPrefix(lines[i], "#") || lines[i] == "") {
		i++
	}
	return strings.TrimRight(strings.Join(lines[i:], "\n"), "\n") + "\n"
}

// Every nginx.conf the README shows is one of these examples, word for
// word, so that TestExamples runs it.
func TestReadmeConfigsAreExamples(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```nginx\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) == 0 {
		t.Fatal("README.md shows no nginx.conf")
	}
	files, err := filepath.Glob("*.conf")
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		bodies[exampleBody(string(b))] = f
	}
	for i, b := range blocks {
		if _, ok := bodies[b[1]]; !ok {
			first, _, _ := strings.Cut(strings.TrimSpace(b[1]), "\n")
			t.Errorf("README's nginx block %d (%q...) is not the body of any examples/*.conf", i+1, first)
		}
	}
}
