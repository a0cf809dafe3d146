package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/certs"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// The design floors are figures only if each hands every call across and
// back: a lost wake-up would hang the host thread, a pickup taken twice
// would make a call twice. Whether the pickup takes a call is the
// machine's scheduling (bench/README.md), so it is logged, not asserted,
// except where it cannot happen (the eventfd way has none).
func TestDesignFloorsHandEveryCall(t *testing.T) {
	ca, err := certs.NewCA("bench test ca")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue(certs.Options{Hosts: []string{"localhost", "127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	srv := qrpc.NewServer(&qrpc.ServerConfig{})
	srv.Handle("echo", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		calls.Add(1)
		resp.Body = req.Body
	})
	addr, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(cert, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	const n = 300
	for _, way := range []string{"eventfd", "pickup", "pickup-nginx"} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDesignFloorChild$", "-test.count=1")
		cmd.Env = append(withoutEnv(os.Environ(), "GOMAXPROCS"), "GOMAXPROCS=1",
			"QRPC_FLOOR_CHILD="+strings.Join([]string{addr.String(), caFile, way, fmt.Sprint(n)}, ","))
		out, err := cmd.CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatalf("%s: %d calls not done in 60 s: a wake-up was lost\n%s", way, n, out)
		}
		if err != nil {
			t.Fatalf("%s: child: %v\n%s", way, err, out)
		}
		var picks int
		i := strings.Index(string(out), "floor: ")
		if i < 0 {
			t.Fatalf("%s: child did not report:\n%s", way, out)
		}
		if _, err := fmt.Sscanf(string(out[i:]), "floor: picks %d", &picks); err != nil {
			t.Fatalf("%s: child's report: %v\n%s", way, err, out)
		}
		t.Logf("%s: %d of %d calls taken by the pickup", way, picks, n)
		if picks < 0 || picks >= n {
			t.Errorf("%s: %d pickups, want 0..%d (the first call is always submitted)", way, picks, n-1)
		}
		if way == "eventfd" && picks != 0 {
			t.Errorf("eventfd: %d pickups, want none", picks)
		}
	}
	// the child's warm-up calls plus every way's
	srv.Close()
	if got, want := calls.Load(), int64(3*(n+min(n/10+1, warmupMax))); got != want {
		t.Errorf("the server answered %d calls, want %d: a call was lost or made twice", got, want)
	}
}

// TestDesignFloorChild is TestDesignFloorsHandEveryCall's child
// (QRPC_FLOOR_CHILD=addr,ca,way,n).
func TestDesignFloorChild(t *testing.T) {
	arg := os.Getenv("QRPC_FLOOR_CHILD")
	if arg == "" {
		t.Skip("run by TestDesignFloorsHandEveryCall")
	}
	f := strings.Split(arg, ",")
	var n int
	if _, err := fmt.Sscan(f[3], &n); err != nil {
		t.Fatal(err)
	}
	c, err := dial(f[0], f[1])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := goSeq(c, min(n/10+1, warmupMax), 100); err != nil {
		t.Fatal(err)
	}
	_, picks, err := designFloor(c, n, 100, f[2])
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("floor: picks %d\n", picks)
}
