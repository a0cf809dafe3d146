package main

// The servers the figures call: the qrpc echo server and the sidecar (both
// child processes, so that their CPU time is their own), and the baselines'
// unix-socket and HTTP echo servers (served by the harness process).

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// serveEcho is the qrpc server child (-serve cert,key): n servers (n
// listening sockets) in this one process, their addresses printed
// comma-separated.
func serveEcho(files string, n int) error {
	certFile, keyFile, ok := strings.Cut(files, ",")
	if !ok {
		return errors.New("-serve wants cert,key")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	var srvs []*qrpc.Server
	var addrs []string
	closeAll := func() error {
		var first error
		for _, s := range srvs {
			if err := s.Close(); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	for range max(n, 1) {
		srv := qrpc.NewServer(&qrpc.ServerConfig{Logger: slog.New(slog.DiscardHandler)})
		srv.Handle("echo", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) { resp.Body = req.Body })
		a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(cert, nil))
		if err != nil {
			_ = closeAll()
			return err
		}
		srvs, addrs = append(srvs, srv), append(addrs, a.String())
	}
	untilStdinCloses(strings.Join(addrs, ","))
	return closeAll()
}

// startServerProcess runs the qrpc server in its own process, as it would
// be in production: a server sharing the Go client's process would spare
// that client the cross-process wake-ups that nginx pays, and flatter the
// baseline.
func startServerProcess(dir string, pair certs.Pair) (*child, error) {
	certFile, keyFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	if err := os.WriteFile(certFile, pair.CertPEM, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(keyFile, pair.KeyPEM, 0o600); err != nil {
		return nil, err
	}
	return startChild("-serve", certFile+","+keyFile)
}

// serveSidecar is the sidecar child (-sidecar qrpc-addr -ca file): what a
// user of stock nginx would deploy instead of this module, an HTTP/1.1
// service next to nginx (proxy_pass, keepalive) that makes each request's
// qrpc call with the Go client. It makes the same call as the in-process
// location /e2e/qrpc and answers with the response body.
func serveSidecar(addr, caFile string) error {
	c, err := dial(addr, caFile)
	if err != nil {
		return err
	}
	defer c.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	body := []byte("hello")
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := c.Unary(r.Context(), "echo", body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		_, _ = w.Write(resp.Body)
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(ln) }()
	untilStdinCloses(ln.Addr().String())
	err = hs.Close()
	<-done
	return err
}

// startUDSEcho is the classic alternative to an in-process queue: a Go
// echo server on a unix socket, framed [u32 big-endian len][bytes].
func startUDSEcho(path string) (func(), error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o666); err != nil { // the workers' user connects
		ln.Close()
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r := bufio.NewReaderSize(c, 128<<10)
				var hdr [4]byte
				buf := make([]byte, 0, 128<<10)
				for {
					if _, err := io.ReadFull(r, hdr[:]); err != nil {
						return
					}
					n := binary.BigEndian.Uint32(hdr[:])
					if n > 16<<20 {
						return
					}
					buf = append(buf[:0], hdr[:]...)
					buf = append(buf, make([]byte, n)...)
					if _, err := io.ReadFull(r, buf[4:]); err != nil {
						return
					}
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	return func() { ln.Close(); wg.Wait() }, nil
}

func startHTTPEcho() (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("hello"))
	})}
	go func() { _ = hs.Serve(ln) }()
	return ln.Addr().String(), func() { _ = hs.Close() }, nil
}
