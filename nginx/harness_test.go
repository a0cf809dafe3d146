package nginx

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
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
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/srvinfo"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/testwait"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

//go:embed nginx.conf.tmpl
var confTemplate string

var confTmpl = template.Must(template.New("nginx.conf").Parse(confTemplate))

// Set up once by TestMain.
var (
	skipReason string         // non-empty: nginx is not installed here
	ng         *ngxtest.Nginx // the nginx under test (QRPC_NGINX) and what it needs
	nginxBin   string
	repoRoot   string
	luaDir     string // the repository's lua/ directory
	libDir     string // holds libffi_qrpc.so
	libPath    string
	testLua    string // nginx/testdata
	shimPath   string // libfake_resty_ffi.so, "" when it could not be built
	shimErr    error

	ca, otherCA   *certs.CA
	clientPair    certs.Pair
	serverTLSCert tls.Certificate
	pinHex        string // SHA-256 of the server certificate's SPKI
	pinB64        string
	shared        *testServer
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	cleanup, err := setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nginx suite setup:", err)
		return 1
	}
	defer cleanup()
	return m.Run()
}

func setup() (func(), error) {
	var err error
	if repoRoot, err = filepath.Abs(".."); err != nil {
		return nil, err
	}
	luaDir = filepath.Join(repoRoot, "lua")
	testLua = filepath.Join(repoRoot, "nginx", "testdata")

	if reason := findNginx(); reason != "" {
		if os.Getenv("CI") == "true" || os.Getenv(ngxtest.EnvNginx) != "" {
			return nil, fmt.Errorf("CI=true but %s", reason)
		}
		skipReason = reason
		return func() {}, nil
	}

	var cleanups []func()
	cleanup := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	fail := func(err error) (func(), error) { cleanup(); return nil, err }

	dir, err := os.MkdirTemp("", "qrpc-lib-")
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { _ = os.RemoveAll(dir) })
	// nginx workers run as nobody when the tests run as root.
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail(err)
	}
	libDir, libPath = dir, filepath.Join(dir, "libffi_qrpc.so")
	built := os.Getenv("QRPC_TEST_LIB") // built beforehand (make test)
	if built == "" {
		built = filepath.Join(dir, ".libffi_qrpc.so.built")
		if err := buildLibrary(built); err != nil {
			return fail(err)
		}
	}
	// Copied for the workers as make install copies it: the page cache of
	// a file written in one go (as the linker writes it) holds folios of
	// up to 2 MB, each mapped whole at a touch, which would make a
	// worker map more of the library, in RSS and PSS, than it does in
	// production (docs/tuning.md, Idle cost).
	if b, err := exec.Command("install", "-m", "755", built, libPath).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("install %s: %v: %s", built, err, b))
	}

	shimPath, shimErr = buildShim(filepath.Join(libDir, "libfake_resty_ffi.so"))
	if shimErr != nil && os.Getenv("CI") == "true" {
		return fail(shimErr)
	}

	if err := makeCerts(); err != nil {
		return fail(err)
	}
	shared, err = newTestServer("127.0.0.1:0", nil)
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { _ = shared.close() })
	return cleanup, nil
}

// findNginx returns why the suite cannot run here, or "". The nginx is
// the one QRPC_NGINX names (see ngxtest.Find); naming one that is not
// there fails the suite rather than skipping it.
func findNginx() string {
	n, err := ngxtest.Find()
	if err != nil {
		return err.Error()
	}
	ng, nginxBin = n, n.Bin
	fmt.Fprintln(os.Stderr, "nginx suite: running against", n)
	return ""
}

// hooksLib returns the library built with the test-only hooks (-tags
// qrpctesthooks: internal/safego's injected panics, armed from Lua with
// qrpc_test_arm), installed beside libPath's copy: QRPC_TEST_HOOKS_LIB
// when make built it, else built here once.
func hooksLib(t *testing.T) string {
	t.Helper()
	hooksOnce.Do(func() {
		dir := filepath.Join(libDir, "hooks")
		if hooksErr = os.MkdirAll(dir, 0o755); hooksErr != nil {
			return
		}
		if hooksErr = os.Chmod(dir, 0o755); hooksErr != nil {
			return
		}
		built := os.Getenv("QRPC_TEST_HOOKS_LIB")
		if built == "" {
			built = filepath.Join(dir, ".libffi_qrpc.so.built")
			if hooksErr = buildLibrary(built, "-tags", "qrpctesthooks"); hooksErr != nil {
				return
			}
		}
		path := filepath.Join(dir, "libffi_qrpc.so")
		if b, err := exec.Command("install", "-m", "755", built, path).CombinedOutput(); err != nil {
			hooksErr = fmt.Errorf("install %s: %v: %s", built, err, b)
			return
		}
		hooksPath = path
	})
	if hooksErr != nil {
		t.Fatal(hooksErr)
	}
	return hooksPath
}

var (
	hooksOnce sync.Once
	hooksPath string
	hooksErr  error
)

func buildLibrary(out string, flags ...string) error {
	goBin := os.Getenv("GO")
	if goBin == "" {
		var err error
		if goBin, err = exec.LookPath("go"); err != nil {
			goBin = "/usr/local/go/bin/go"
		}
	}
	cmd := exec.Command(goBin, append(append([]string{"build"}, flags...), "-buildmode=c-shared", "-o", out, "./ffi")...)
	cmd.Dir = repoRoot
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building libffi_qrpc.so: %v\n%s", err, b)
	}
	return os.Chmod(out, 0o755)
}

// buildShim compiles testdata/fake_resty_ffi.c, the stand-in for
// lua-resty-ffi's C side.
func buildShim(out string) (string, error) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		return "", fmt.Errorf("no C compiler (%s) for testdata/fake_resty_ffi.c: %w", cc, err)
	}
	cmd := exec.Command(cc, "-O2", "-Wall", "-shared", "-fPIC", "-o", out,
		filepath.Join(testLua, "fake_resty_ffi.c"), "-lpthread")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the lua-resty-ffi stand-in: %v\n%s", err, b)
	}
	return out, os.Chmod(out, 0o755)
}

func makeCerts() error {
	var err error
	if ca, err = certs.NewCA("qrpc test CA"); err != nil {
		return err
	}
	if otherCA, err = certs.NewCA("some other CA"); err != nil {
		return err
	}
	if serverTLSCert, err = ca.IssueLocal(); err != nil {
		return err
	}
	if clientPair, err = ca.Issue(certs.Options{Hosts: []string{"nginx-worker"}, Client: true}); err != nil {
		return err
	}
	leaf, err := x509.ParseCertificate(serverTLSCert.Certificate[0])
	if err != nil {
		return err
	}
	sum := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	pinHex = hex.EncodeToString(sum[:])
	pinB64 = base64.StdEncoding.EncodeToString(sum[:])
	return nil
}

func requireNginx(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// ---- the qrpc server ---------------------------------------------------------

// testServer is a qrpc server with the handlers the Lua snippets call. It
// counts events per body and the connections that carried requests.
type testServer struct {
	clientCAs *x509.CertPool
	cfg       qrpc.ServerConfig
	block     chan struct{} // the "block" event handler waits for it to close
	unblock   sync.Once

	mu     sync.Mutex
	srv    *qrpc.Server
	addr   string
	events map[string]int
	conns  map[context.Context]struct{}
	slow   int // slow handlers running
	probes []time.Time

	// whoDelay (ms) holds each "who" call: a test makes one server of a
	// pool slow without changing what the callers ask.
	whoDelay atomic.Int64
}

// ownServer starts a qrpc server for one test only (tests that restart or
// count connections must not share one), closed when the test ends.
func ownServer(t *testing.T) *testServer {
	t.Helper()
	srv, err := newTestServer("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.close() })
	return srv
}

func newTestServer(addr string, clientCAs *x509.CertPool) (*testServer, error) {
	return newTestServerCfg(addr, clientCAs, qrpc.ServerConfig{})
}

// newTestServerCfg starts a server with cfg (its reset key is set here).
func newTestServerCfg(addr string, clientCAs *x509.CertPool, cfg qrpc.ServerConfig) (*testServer, error) {
	s := &testServer{clientCAs: clientCAs, cfg: cfg, events: map[string]int{}, conns: map[context.Context]struct{}{},
		block: make(chan struct{})}
	if err := s.start(addr); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *testServer) start(addr string) error {
	// The server derives its stateless reset key from the certificate: a
	// restart with the same one resets the old connections.
	cfg := s.cfg
	srv := qrpc.NewServer(&cfg)
	s.register(srv)
	a, err := srv.Listen(addr, qrpc.ServerTLSConfig(serverTLSCert, s.clientCAs))
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.srv, s.addr = srv, a.String()
	s.mu.Unlock()
	return nil
}

// restart stops the server and starts a new process-like instance on the
// same port with the same certificate (and so the same reset key).
func (s *testServer) restart(down time.Duration) error {
	s.mu.Lock()
	srv, addr := s.srv, s.addr
	s.mu.Unlock()
	_ = srv.Close()
	time.Sleep(down) // the scenario: the server is down this long
	var err error
	testwait.For(5*time.Second, func() bool { // the port may take a moment to be free again
		err = s.start(addr)
		return err == nil
	})
	if err == nil {
		return nil
	}
	return fmt.Errorf("restart on %s: %w", addr, err)
}

func (s *testServer) release() { s.unblock.Do(func() { close(s.block) }) }

func (s *testServer) stop() {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	_ = srv.Close()
}

func (s *testServer) close() error {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	return srv.Close()
}

func (s *testServer) seen(ctx context.Context) {
	s.mu.Lock()
	s.conns[srvinfo.Conn(ctx)] = struct{}{}
	s.mu.Unlock()
}

func (s *testServer) connCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *testServer) eventCount(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.events[key]
}

func (s *testServer) register(srv *qrpc.Server) {
	srv.Handle("echo", func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.seen(ctx)
		resp.Body = append([]byte(nil), req.Body...)
		for _, h := range req.Headers {
			resp.Headers = append(resp.Headers, append([]byte(nil), h...))
		}
	})
	srv.Handle("greet", func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.seen(ctx)
		resp.Body = []byte("hello, " + string(req.Body))
		for _, h := range req.Headers {
			resp.Headers = append(resp.Headers, append([]byte(nil), h...))
		}
		resp.Headers = append(resp.Headers, []byte("x-greeted"), []byte("yes"))
	})
	srv.Handle("fail", func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.seen(ctx)
		resp.Code = 7
		resp.Body = []byte("failed on purpose")
	})
	// stream answers the id of the QUIC stream the call came on, so that
	// a test can tell how the client spread its calls.
	srv.Handle("stream", func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		id, _ := srvinfo.StreamID(ctx)
		resp.Body = strconv.AppendInt(nil, id, 10)
	})
	// probe is the active check of the shared-pool tests: it counts and
	// times its calls.
	srv.Handle("probe", func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.mu.Lock()
		s.events["probe"]++
		s.probes = append(s.probes, time.Now())
		s.mu.Unlock()
	})
	// who answers the server's listen address, so that a pool test can
	// tell which server a call went to.
	srv.Handle("who", func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.seen(ctx)
		if ms := s.whoDelay.Load(); ms > 0 {
			select {
			case <-time.After(time.Duration(ms) * time.Millisecond):
			case <-ctx.Done():
			}
		}
		s.mu.Lock()
		resp.Body = []byte(s.addr)
		s.mu.Unlock()
	})
	// slow sleeps the number of milliseconds in the body.
	srv.Handle("slow", func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.seen(ctx)
		ms, _ := strconv.Atoi(string(req.Body))
		s.mu.Lock()
		s.slow++
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.slow--
			s.mu.Unlock()
		}()
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-ctx.Done():
		}
		resp.Body = []byte("slept " + string(req.Body))
	})
	// big answers with the number of bytes in the body, compressible (so
	// the frame goes out zstd-compressed), and their MD5 in x-md5.
	srv.Handle("big", func(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
		s.seen(ctx)
		n, _ := strconv.Atoi(string(req.Body))
		var b bytes.Buffer
		for i := 0; b.Len() < n; i++ {
			fmt.Fprintf(&b, "line %07d of a compressible body\n", i)
		}
		resp.Body = b.Bytes()[:n]
		resp.Headers = [][]byte{[]byte("x-md5"), []byte(md5hex(resp.Body))}
	})
	// block holds its handler until release: with MaxHandlers 1 the server
	// stops reading, so the client's send queue fills.
	srv.HandleEvent("block", func(ctx context.Context, req *qrpc.Request) {
		select {
		case <-s.block:
		case <-ctx.Done():
		}
	})
	srv.HandleEvent("count", func(ctx context.Context, req *qrpc.Request) {
		s.seen(ctx)
		s.mu.Lock()
		s.events[string(req.Body)]++
		s.mu.Unlock()
	})
}

// ---- nginx -----------------------------------------------------------------

// ngxConf shapes one nginx instance.
type ngxConf struct {
	Workers  int    // default 2
	LogLevel string // default notice
	Main     string // main-level directives
	HTTP     string // http-level directives
	Server   string // locations
	// InitByLua replaces the default init_by_lua code, which configures the
	// library path and the socket directory.
	InitByLua       string
	InitWorkerByLua string
	EnvNames        []string // env directives
	ProcEnv         []string // K=V added to nginx's environment
	// Server the qrpc server qtest.addr points at (default: shared).
	QServer *testServer
	// Extra are more string fields of the qtest module.
	Extra map[string]string
	// AllowErrors are regexps of [error] lines this test expects;
	// AllowAlerts of [alert] lines (a worker the test kills).
	AllowErrors []string
	AllowAlerts []string
	// Hooks: the workers load the library with the test-only hooks
	// (hooksLib) instead of the release build.
	Hooks bool
	lib   string // the library the workers load (startNginx)
	// Stream, when set, is the inside of a stream {} block (servers),
	// a template: {{.StreamPort}} and {{.StreamPort2}} are free ports for
	// its listen directives (nginxProc.streamPort, streamPort2). Its
	// init_by_lua is StreamInitByLua, by default the configure of the
	// library path and socket directory (host chosen by the library: the
	// stream subsystem has the built-in host only). Needs ngx_stream_lua.
	Stream          string
	StreamInitByLua string
}

type nginxProc struct {
	t    *testing.T
	dir  string
	port int
	// streamPort, streamPort2: the ports ngxConf.Stream may listen on
	streamPort, streamPort2 int
	conf                    string
	cmd                     *exec.Cmd
	exited                  chan struct{}
	client                  *http.Client
	allow, allowAlerts      []*regexp.Regexp

	stopOnce sync.Once
}

// startNginx writes the config of c into a fresh prefix directory and
// starts nginx on a free port; the test's cleanup stops it and checks its
// error log.
func startNginx(t *testing.T, c ngxConf) *nginxProc {
	t.Helper()
	requireNginx(t)
	if c.Workers == 0 {
		c.Workers = 2
	}
	if c.LogLevel == "" {
		c.LogLevel = "notice"
	}
	if c.QServer == nil {
		c.QServer = shared
	}
	dir, err := os.MkdirTemp("", "qng-")
	if err != nil {
		t.Fatal(err)
	}
	keep := os.Getenv("QRPC_KEEP") != ""
	t.Cleanup(func() {
		if !keep {
			_ = os.RemoveAll(dir)
		} else {
			t.Logf("kept %s", dir)
		}
	})
	// Workers run as nobody when the suite runs as root: they must read the
	// prefix and create the wake-up socket in run/.
	for _, d := range []string{dir, filepath.Join(dir, "tmp"), filepath.Join(dir, "run")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "run"), os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}

	// The Lua code runs from copies in the prefix: workers run as nobody
	// under root, and a checkout under /root is not readable by nobody.
	// (This also keeps the library search away from a built checkout.)
	lua := filepath.Join(dir, "lua")
	if err := copyTree(luaDir, lua, ".lua"); err != nil {
		t.Fatal(err)
	}
	if err := copyTree(testLua, dir, ".lua"); err != nil {
		t.Fatal(err)
	}

	c.lib = libPath
	if c.Hooks {
		c.lib = hooksLib(t)
	}
	port := ngxtest.FreePort(t)
	init := c.InitByLua
	if init == "" {
		// The flavour's host: with lua-resty-ffi there, every call of the
		// suite goes through it.
		init = fmt.Sprintf("        assert(require(\"resty.ffi.qrpc\").configure{ host = %q, lib = %q, socket_dir = %q })",
			ng.Host(), c.lib, filepath.Join(dir, "run"))
	}
	var envNames []string
	for _, e := range c.EnvNames {
		if e != "LD_LIBRARY_PATH" || ng.RestyFFILib == "" { // MainConf has it then
			envNames = append(envNames, e)
		}
	}
	var streamPort, streamPort2 int
	stream := ""
	if c.Stream != "" {
		streamPort, streamPort2 = ngxtest.FreePort(t), ngxtest.FreePort(t)
		tmpl, err := template.New("stream").Parse(c.Stream)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := tmpl.Execute(&b, map[string]int{"StreamPort": streamPort, "StreamPort2": streamPort2}); err != nil {
			t.Fatal(err)
		}
		stream = b.String()
	}
	streamInit := c.StreamInitByLua
	if streamInit == "" {
		streamInit = fmt.Sprintf("        assert(require(\"resty.ffi.qrpc\").configure{ lib = %q, socket_dir = %q })",
			c.lib, filepath.Join(dir, "run"))
	}
	data := map[string]any{
		"Dir": dir, "LuaDir": lua, "Port": port, "Workers": c.Workers, "LogLevel": c.LogLevel,
		"EnvNames": envNames, "Main": c.Main, "HTTP": c.HTTP, "Server": c.Server,
		"InitByLua": init, "InitWorkerByLua": c.InitWorkerByLua,
		"NginxMain": ng.MainConf(), "LuaPath": ng.PackagePath(dir+"/?.lua", lua+"/?.lua"), "HostInit": ng.InitLua(),
		"Stream": stream, "StreamInitByLua": streamInit,
	}
	var conf bytes.Buffer
	if err := confTmpl.Execute(&conf, data); err != nil {
		t.Fatal(err)
	}
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, conf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "qtest.lua"), []byte(qtestModule(t, c, dir)), 0o644); err != nil {
		t.Fatal(err)
	}

	n := &nginxProc{
		t: t, dir: dir, port: port, streamPort: streamPort, streamPort2: streamPort2, conf: confPath, exited: make(chan struct{}),
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}},
	}
	for _, re := range c.AllowErrors {
		n.allow = append(n.allow, regexp.MustCompile(re))
	}
	for _, re := range c.AllowAlerts {
		n.allowAlerts = append(n.allowAlerts, regexp.MustCompile(re))
	}
	n.cmd = exec.Command(nginxBin, "-p", dir+"/", "-c", confPath, "-e", filepath.Join(dir, "error.log"))
	n.cmd.Env = ng.Environ(nil, c.ProcEnv...)
	// If the test binary dies, the master is told to quit (its workers follow).
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGQUIT}
	out, err := os.Create(filepath.Join(dir, "stdout.log"))
	if err != nil {
		t.Fatal(err)
	}
	n.cmd.Stdout, n.cmd.Stderr = out, out
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("start nginx: %v", err)
	}
	go func() {
		_ = n.cmd.Wait()
		_ = out.Close()
		close(n.exited)
	}()
	t.Cleanup(n.stop)

	if !testwait.For(15*time.Second, func() bool {
		select {
		case <-n.exited:
			t.Fatalf("nginx exited at start:\n%s\n%s", n.readFile("stdout.log"), n.errorLog())
		default:
		}
		c, err := net.DialTimeout("tcp", n.addr(), 200*time.Millisecond)
		if err != nil {
			return false
		}
		_ = c.Close()
		return len(n.workerPIDs()) >= 1
	}) {
		t.Fatalf("nginx did not start listening on %s:\n%s", n.addr(), n.errorLog())
	}
	return n
}

// qtestModule renders the Lua module the snippets share: the qrpc server's
// address and credentials, and connect helpers.
func qtestModule(t *testing.T, c ngxConf, dir string) string {
	var b strings.Builder
	field := func(k, v string) { fmt.Fprintf(&b, "    %s = [==[%s]==],\n", k, v) }
	b.WriteString("local qrpc = require \"resty.ffi.qrpc\"\nlocal _M = {\n")
	field("addr", c.QServer.addr)
	field("shared_addr", shared.addr)
	field("ca", string(ca.CertPEM))
	field("other_ca", string(otherCA.CertPEM))
	field("cert", string(clientPair.CertPEM))
	field("key", string(clientPair.KeyPEM))
	field("pin_hex", pinHex)
	field("pin_b64", pinB64)
	field("lib", c.lib)
	field("shim", shimPath)
	field("dir", dir)
	field("test", t.Name())
	// What this nginx is (ngxtest.Nginx): snippets adapt to it.
	field("flavour", ng.Flavour)
	field("host", ng.Host())
	b.WriteString(fmt.Sprintf("    pipe = %t,\n    lua52_exec = %t,\n", ng.Pipe, ng.Lua52Exec))
	for k, v := range c.Extra {
		field(k, v)
	}
	b.WriteString(`}

-- opts: the default connect options (verify against the test CA), with
-- extra fields merged in. A new table each time: the connection cache
-- matches options by value.
function _M.opts(extra)
    local o = { ca = _M.ca, server_name = "localhost" }
    if extra then
        for k, v in pairs(extra) do
            o[k] = v
        end
    end
    return o
end

function _M.connect(extra, addr)
    return qrpc.connect(addr or _M.addr, _M.opts(extra))
end

-- wait is the snippets' one bounded wait: it polls f() until it returns
-- a true value (returned) or secs pass (f's last value returned). secs is
-- a deadline for failure only, generous for a loaded machine.
function _M.wait(secs, f)
    local deadline = ngx.now() + secs
    while true do
        local v = f()
        if v or ngx.now() >= deadline then
            return v
        end
        ngx.sleep(0.01) -- the poll interval: the one sleep behind every wait
        ngx.update_time()
    end
end

-- logged reports whether a line of this nginx's error.log matches the Lua
-- pattern pat: an event a snippet can wait for (with wait).
function _M.logged(pat)
    local f = io.open(_M.dir .. "/error.log")
    if not f then
        return false
    end
    local text = f:read("*a")
    f:close()
    return text:find(pat) ~= nil
end

return _M
`)
	return b.String()
}

// copyTree copies the files ending in ext under src into dst, readable by
// everyone.
func copyTree(src, dst, ext string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			return os.Chmod(target, 0o755)
		}
		if !strings.HasSuffix(p, ext) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}

func (n *nginxProc) addr() string { return fmt.Sprintf("127.0.0.1:%d", n.port) }

func (n *nginxProc) url(path string) string { return "http://" + n.addr() + path }

func (n *nginxProc) readFile(name string) string {
	b, _ := os.ReadFile(filepath.Join(n.dir, name))
	return string(b)
}

func (n *nginxProc) errorLog() string { return n.readFile("error.log") }

func (n *nginxProc) masterPID() int { return n.cmd.Process.Pid }

// workerPIDs lists the master's children (its worker processes).
func (n *nginxProc) workerPIDs() []int {
	return childPIDs(n.masterPID())
}

func childPIDs(ppid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", ppid, ppid))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// procState describes what the threads of pid are doing (for a hang).
func procState(pid int) string {
	var b strings.Builder
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/comm", pid, task.Name()))
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/wchan", pid, task.Name()))
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		st := ""
		if f := strings.Fields(string(stat)); len(f) > 2 {
			st = f[2]
		}
		fmt.Fprintf(&b, "\n  task %s %s state=%s wchan=%s", task.Name(), strings.TrimSpace(string(comm)), st, wchan)
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		fmt.Fprintf(&b, "\n  fd %s -> %s", fd.Name(), l)
	}
	return b.String()
}

func pidAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie has exited; its parent has not reaped it yet.
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// do sends one request and returns status, body, headers.
func (n *nginxProc) do(method, path, body string) (int, string, http.Header, error) {
	req, err := http.NewRequest(method, n.url(path), strings.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	resp, err := n.client.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}

// get fails the test on a transport error.
func (n *nginxProc) get(path string) (int, string) {
	n.t.Helper()
	st, body, _, err := n.do("GET", path, "")
	if err != nil {
		n.t.Fatalf("GET %s: %v", path, err)
	}
	return st, body
}

// signal runs `nginx -s sig` against this instance.
func (n *nginxProc) signal(sig string) {
	n.t.Helper()
	cmd := ng.Command("-p", n.dir+"/", "-c", n.conf, "-e", filepath.Join(n.dir, "error.log"), "-s", sig)
	if b, err := cmd.CombinedOutput(); err != nil {
		n.t.Fatalf("nginx -s %s: %v\n%s", sig, err, b)
	}
}

// waitExit waits for the master to exit; false after d.
func (n *nginxProc) waitExit(d time.Duration) bool {
	select {
	case <-n.exited:
		return true
	case <-time.After(d):
		return false
	}
}

// stop quits nginx gracefully (killing it after 10 s) and checks the error
// log: no [alert], [crit] or [emerg], and no [error] the test did not allow.
func (n *nginxProc) stop() {
	n.stopOnce.Do(func() {
		t := n.t
		// A connection the HTTP client dialled but never used waits in
		// nginx for its first request (client_header_timeout, 60 s) and
		// keeps a quitting worker alive: close those first.
		n.client.CloseIdleConnections()
		select {
		case <-n.exited:
		default:
			_ = n.cmd.Process.Signal(syscall.SIGQUIT)
			if !n.waitExit(10 * time.Second) {
				t.Errorf("nginx did not quit within 10 s (workers %v)", n.workerPIDs())
				for _, pid := range n.workerPIDs() {
					t.Logf("worker %d: %s", pid, procState(pid))
				}
				_ = syscall.Kill(-n.masterPID(), syscall.SIGKILL)
				n.waitExit(5 * time.Second)
			}
		}
		n.checkLog()
		if t.Failed() {
			t.Logf("error.log of %s:\n%s", t.Name(), tail(n.errorLog(), 80))
		}
	})
}

// checkLog fails the test on each line of error.log that ngxtest.Problems
// reports: [alert], [crit], [emerg], or an [error] no AllowErrors matches.
func (n *nginxProc) checkLog() {
	for _, line := range ngxtest.Problems(n.errorLog(), n.allowed) {
		if n.alertAllowed(line) {
			continue
		}
		n.t.Errorf("unexpected line in error.log: %s", line)
	}
}

func (n *nginxProc) alertAllowed(line string) bool {
	for _, re := range n.allowAlerts {
		if strings.Contains(line, "[alert]") && re.MatchString(line) {
			return true
		}
	}
	return false
}

func (n *nginxProc) allowed(line string) bool {
	for _, re := range n.allow {
		if re.MatchString(line) {
			return true
		}
	}
	return false
}

// logCount counts the error.log lines matching re.
func (n *nginxProc) logCount(re string) int {
	r := regexp.MustCompile(re)
	c := 0
	for _, l := range strings.Split(n.errorLog(), "\n") {
		if r.MatchString(l) {
			c++
		}
	}
	return c
}

func tail(s string, lines int) string {
	ls := strings.Split(s, "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// eventually polls f every 20 ms until it returns nil or d passes.
func eventually(d time.Duration, f func() error) error {
	var err error
	testwait.For(d, func() bool { err = f(); return err == nil })
	return err
}

var errNotYet = errors.New("not yet")

func md5hex(b []byte) string {
	s := md5.Sum(b)
	return hex.EncodeToString(s[:])
}
