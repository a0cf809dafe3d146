// Command qrpc-demo is the qrpc server behind the demo nginx.conf.
//
// It serves the same methods on two UDP listeners: one with plain server TLS
// and one that requires a client certificate (mTLS). Without -cert/-key it
// makes its own CA, server certificate (localhost, 127.0.0.1) and client
// certificate, and writes them to -certs-dir so that nginx can trust the
// server and present the client certificate. Files found there from an
// earlier run are reused, so restarting the server does not invalidate the
// PEM strings a running nginx already holds.
//
// Methods:
//
//	greet   body = name             -> "Hello <name>!"
//	echo    body, headers           -> the same body and headers
//	slow    body = milliseconds     -> sleeps (capped by -max-sleep), "slept <n> ms"
//	fail    body = code (optional)  -> non-zero code (default 1) and a message
//	stats                           -> {"notify":N,"calls":M}
//	route   body = TLS server name  -> the backend to send it to: the name's
//	                                   first label when it is "blue" or "green",
//	                                   else "green"
//	notify  (event)                 -> counted
//	SayHello      demo.HelloRequest -> demo.HelloReply{message: "Hello <name>!"}
//	EchoAllKinds  demo.AllKinds     -> the same message (demo/proto/greeter.proto)
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Response codes of the demo methods.
const (
	codeFailDefault uint32 = 1
	codeBadRequest  uint32 = 3
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "qrpc-demo:", err)
		os.Exit(1)
	}
}

type options struct {
	addr, mtlsAddr  string
	certFile        string
	keyFile         string
	clientCAFile    string
	certsDir        string
	readyFile       string
	maxSleep        time.Duration
	verbose         bool
	regenerateCerts bool
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("qrpc-demo", flag.ContinueOnError)
	fs.StringVar(&o.addr, "addr", envOr("QRPC_DEMO_ADDR", "127.0.0.1:8443"), "UDP address of the TLS listener (env QRPC_DEMO_ADDR)")
	fs.StringVar(&o.mtlsAddr, "mtls-addr", envOr("QRPC_DEMO_MTLS_ADDR", "127.0.0.1:8444"), "UDP address of the listener that requires a client certificate; empty disables it (env QRPC_DEMO_MTLS_ADDR)")
	fs.StringVar(&o.certFile, "cert", "", "server certificate (PEM); default: generated")
	fs.StringVar(&o.keyFile, "key", "", "server private key (PEM)")
	fs.StringVar(&o.clientCAFile, "client-ca", "", "CA (PEM) that signs client certificates on the mTLS listener; required with -cert unless -mtls-addr is empty")
	fs.StringVar(&o.certsDir, "certs-dir", "demo/run/certs", "where generated certificates are written (and reused from)")
	fs.StringVar(&o.readyFile, "ready-file", "", "written once both listeners are bound: lines addr=... and mtls_addr=...")
	fs.DurationVar(&o.maxSleep, "max-sleep", 10*time.Second, "cap of the slow method's sleep")
	fs.BoolVar(&o.verbose, "v", false, "debug logging")
	fs.BoolVar(&o.regenerateCerts, "regenerate-certs", false, "make new certificates even if -certs-dir holds usable ones")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if (o.certFile == "") != (o.keyFile == "") {
		return o, errors.New("-cert and -key go together")
	}
	if o.certFile != "" && o.mtlsAddr != "" && o.clientCAFile == "" {
		return o, errors.New("-cert needs -client-ca for the mTLS listener (or -mtls-addr '' to disable it)")
	}
	return o, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(args []string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if o.verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	inst, err := start(o, logger)
	if err != nil {
		return err
	}
	defer inst.close()
	if o.readyFile != "" {
		if err := writeAtomic(o.readyFile, []byte(fmt.Sprintf("addr=%s\nmtls_addr=%s\n", inst.addr, inst.mtlsAddr)), 0o644); err != nil {
			return fmt.Errorf("ready file: %w", err)
		}
		defer func() { _ = os.Remove(o.readyFile) }()
	}
	logger.Info("qrpc-demo ready", "addr", inst.addr, "mtls_addr", inst.mtlsAddr, "certs", inst.certs)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	s := <-sig
	logger.Info("qrpc-demo stopping", "signal", s.String(), "notify", inst.demo.notify.Load(), "calls", inst.demo.calls.Load())
	return nil
}

// instance is a running demo: one or two listeners sharing one demo state.
type instance struct {
	demo           *demo
	addr, mtlsAddr string // bound addresses; mtlsAddr is empty when disabled
	certs          string // where the TLS material came from
	servers        []*qrpc.Server
}

func (in *instance) close() {
	for _, s := range in.servers {
		_ = s.Close()
	}
}

func start(o options, logger *slog.Logger) (*instance, error) {
	mat, err := loadMaterial(o)
	if err != nil {
		return nil, err
	}
	in := &instance{demo: &demo{maxSleep: o.maxSleep}, certs: mat.where}
	// The stateless reset key comes from the certificate (the server's
	// default): a restarted demo resets its old connections.
	cfg := &qrpc.ServerConfig{Logger: logger}

	listen := func(addr string, clientCAs *x509.CertPool) (string, error) {
		s := qrpc.NewServer(cfg)
		in.demo.register(s)
		a, err := s.Listen(addr, qrpc.ServerTLSConfig(mat.cert, clientCAs))
		if err != nil {
			return "", err
		}
		in.servers = append(in.servers, s)
		return a.String(), nil
	}
	if in.addr, err = listen(o.addr, nil); err != nil {
		return nil, err
	}
	if o.mtlsAddr != "" {
		if in.mtlsAddr, err = listen(o.mtlsAddr, mat.clientCAs); err != nil {
			in.close()
			return nil, err
		}
	}
	return in, nil
}

// demo holds the handlers' shared state; both listeners serve the same one.
type demo struct {
	maxSleep time.Duration
	notify   atomic.Uint64
	calls    atomic.Uint64
}

func (d *demo) register(s *qrpc.Server) {
	s.Handle("greet", d.greet)
	s.Handle("echo", d.echo)
	s.Handle("slow", d.slow)
	s.Handle("fail", d.fail)
	s.Handle("stats", d.stats)
	s.Handle("route", d.route)
	s.HandleEvent("notify", func(context.Context, *qrpc.Request) { d.notify.Add(1) })
	d.registerProto(s)
}

func (d *demo) greet(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
	d.calls.Add(1)
	name := strings.TrimSpace(string(req.Body))
	if name == "" {
		name = "world"
	}
	resp.Body = []byte("Hello " + name + "!")
}

func (d *demo) echo(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
	d.calls.Add(1)
	// The request is only ours until we return, and the response is written
	// after that: keep copies.
	resp.Body = append([]byte(nil), req.Body...)
	resp.Headers = make([][]byte, len(req.Headers))
	for i, h := range req.Headers {
		resp.Headers[i] = append([]byte(nil), h...)
	}
}

func (d *demo) slow(ctx context.Context, req *qrpc.Request, resp *qrpc.Response) {
	d.calls.Add(1)
	ms, err := strconv.Atoi(strings.TrimSpace(string(req.Body)))
	if err != nil || ms < 0 {
		resp.Code = codeBadRequest
		resp.Body = []byte("slow: body must be a non-negative number of milliseconds")
		return
	}
	dur := min(time.Duration(ms)*time.Millisecond, d.maxSleep)
	t := time.NewTimer(dur)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done(): // connection gone: nobody reads the answer
	}
	resp.Body = []byte(fmt.Sprintf("slept %d ms", dur.Milliseconds()))
}

func (d *demo) fail(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
	d.calls.Add(1)
	code := codeFailDefault
	if s := strings.TrimSpace(string(req.Body)); s != "" {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n == 0 {
			resp.Code = codeBadRequest
			resp.Body = []byte("fail: body must be a non-zero code")
			return
		}
		code = uint32(n)
	}
	resp.Code = code
	resp.Body = []byte(fmt.Sprintf("failed on purpose with code %d", code))
}

// route stands for a routing service (a table of tenants, a canary
// split): the stream example's preread phase asks it where a TLS
// connection goes, by the server name the client sent.
func (d *demo) route(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
	d.calls.Add(1)
	label, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(string(req.Body))), ".")
	switch label {
	case "blue", "green":
		resp.Body = []byte(label)
	default:
		resp.Body = []byte("green")
	}
}

func (d *demo) stats(_ context.Context, _ *qrpc.Request, resp *qrpc.Response) {
	resp.Body = []byte(fmt.Sprintf(`{"notify":%d,"calls":%d}`, d.notify.Load(), d.calls.Load()))
}

// material is the TLS material the listeners need.
type material struct {
	cert      tls.Certificate
	clientCAs *x509.CertPool
	where     string
}

// Files of -certs-dir. nginx reads ca.pem, client.pem and client.key.
const (
	fileCA         = "ca.pem"
	fileServerCert = "server.pem"
	fileServerKey  = "server.key"
	fileClientCert = "client.pem"
	fileClientKey  = "client.key"
)

func loadMaterial(o options) (material, error) {
	if o.certFile != "" {
		cert, err := tls.LoadX509KeyPair(o.certFile, o.keyFile)
		if err != nil {
			return material{}, fmt.Errorf("load -cert/-key: %w", err)
		}
		m := material{cert: cert, where: o.certFile}
		if o.clientCAFile != "" {
			pool, err := loadPool(o.clientCAFile)
			if err != nil {
				return material{}, fmt.Errorf("-client-ca: %w", err)
			}
			m.clientCAs = pool
		}
		return m, nil
	}
	if !o.regenerateCerts {
		if m, err := reuseMaterial(o.certsDir); err == nil {
			return m, nil
		}
	}
	return generateMaterial(o.certsDir)
}

// reuseMaterial accepts the files of an earlier run only when they are all
// there, the server certificate chains to the CA and lives for another day.
func reuseMaterial(dir string) (material, error) {
	for _, f := range []string{fileCA, fileServerCert, fileServerKey, fileClientCert, fileClientKey} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return material{}, err
		}
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, fileServerCert), filepath.Join(dir, fileServerKey))
	if err != nil {
		return material{}, err
	}
	if _, err := tls.LoadX509KeyPair(filepath.Join(dir, fileClientCert), filepath.Join(dir, fileClientKey)); err != nil {
		return material{}, err
	}
	pool, err := loadPool(filepath.Join(dir, fileCA))
	if err != nil {
		return material{}, err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return material{}, err
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:       pool,
		DNSName:     "localhost",
		CurrentTime: time.Now().Add(24 * time.Hour),
	}); err != nil {
		return material{}, err
	}
	if err := leaf.VerifyHostname("127.0.0.1"); err != nil {
		return material{}, err
	}
	return material{cert: cert, clientCAs: pool, where: dir + " (reused)"}, nil
}

func generateMaterial(dir string) (material, error) {
	ca, err := certs.NewCA("qrpc demo CA")
	if err != nil {
		return material{}, err
	}
	server, err := ca.Issue(certs.Options{Hosts: []string{"localhost", "127.0.0.1", "::1"}})
	if err != nil {
		return material{}, err
	}
	client, err := ca.Issue(certs.Options{Hosts: []string{"qrpc-demo-client"}, Client: true})
	if err != nil {
		return material{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return material{}, fmt.Errorf("certs dir: %w", err)
	}
	files := []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{fileCA, ca.CertPEM, 0o644},
		{fileServerCert, server.CertPEM, 0o644},
		{fileServerKey, server.KeyPEM, 0o600},
		{fileClientCert, client.CertPEM, 0o644},
		{fileClientKey, client.KeyPEM, 0o600},
	}
	for _, f := range files {
		if err := writeAtomic(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return material{}, fmt.Errorf("write certificate: %w", err)
		}
	}
	cert, err := server.TLS()
	if err != nil {
		return material{}, err
	}
	return material{cert: cert, clientCAs: ca.Pool(), where: dir + " (generated)"}, nil
}

func loadPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", file)
	}
	// A PEM block that is not a certificate is worth refusing too: it is
	// usually a key pasted into the wrong file.
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%s: unexpected PEM block %q", file, blk.Type)
		}
	}
	return pool, nil
}

// writeAtomic makes readers (nginx, scripts polling for the ready file)
// never see a half-written file.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
