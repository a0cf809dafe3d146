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
// except where it cannot happen (the eventfd way has none). A lost
// wake-up shows as a child that takes ten times what the same child
// takes with the Go client's plain loop (measured first).
func TestDesignFloorsHandEveryCall(t *testing.T) {
	var calls atomic.Int64
	addr, caFile := floorServer(t, &calls)
	const n = 300
	t0 := time.Now()
	if out, err := floorChild(context.Background(), addr, caFile, "seq", n, 0); err != nil {
		t.Fatalf("seq: child: %v\n%s", err, out)
	}
	bound := 10 * time.Since(t0)
	for _, way := range floorWays {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		out, err := floorChild(ctx, addr, caFile, way, n, 0)
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatalf("%s: %d calls not done in %v: a wake-up was lost\n%s", way, n, bound, out)
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
		if (way == "eventfd" || way == "export") && picks != 0 {
			t.Errorf("%s: %d pickups, want none", way, picks)
		}
	}
	// each child's warm-up calls and its own (each child has exited)
	if got, want := calls.Load(), int64((len(floorWays)+1)*(n+min(n/10+1, warmupMax))); got != want {
		t.Errorf("the server answered %d calls, want %d: a call was lost or made twice", got, want)
	}
}

// A host thread that fails must end its floor with the error, not leave
// the goroutine waiting for a call that never comes: make bench waits for
// its children without a bound. The bound here is ten times what the
// same child takes to run all its calls (measured first, on this machine).
func TestDesignFloorHostErrorEnds(t *testing.T) {
	addr, caFile := floorServer(t, nil)
	const n = 300
	for _, way := range floorWays {
		t0 := time.Now()
		if out, err := floorChild(context.Background(), addr, caFile, way, n, 0); err != nil {
			t.Fatalf("%s: child: %v\n%s", way, err, out)
		}
		bound := 10 * time.Since(t0)
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		out, err := floorChild(ctx, addr, caFile, way, n, n/2)
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatalf("%s: a host thread failing at call %d: the child hangs (killed after %v)\n%s", way, n/2, bound, out)
		}
		if err == nil || !strings.Contains(string(out), "host thread: input/output error") {
			t.Fatalf("%s: a host thread failing at call %d: %v, want the child to fail with the host thread's error\n%s", way, n/2, err, out)
		}
	}
}

// floorServer is an echo server for the floors' children; calls counts
// its calls when not nil.
func floorServer(t *testing.T, calls *atomic.Int64) (addr, caFile string) {
	t.Helper()
	ca, pair := testCA(t)
	cert, err := pair.TLS()
	if err != nil {
		t.Fatal(err)
	}
	srv := qrpc.NewServer(&qrpc.ServerConfig{})
	srv.Handle("echo", func(_ context.Context, req *qrpc.Request, resp *qrpc.Response) {
		if calls != nil {
			calls.Add(1)
		}
		resp.Body = req.Body
	})
	a, err := srv.Listen("127.0.0.1:0", qrpc.ServerTLSConfig(cert, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return a.String(), caFile
}

// floorChild runs TestDesignFloorChild: n calls handed the way way, the
// host thread failing before call failAt (0: never).
func floorChild(ctx context.Context, addr, caFile, way string, n, failAt int) ([]byte, error) {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDesignFloorChild$", "-test.count=1")
	cmd.Env = append(withoutEnv(os.Environ(), "GOMAXPROCS"), "GOMAXPROCS=1",
		"QRPC_FLOOR_CHILD="+strings.Join([]string{addr, caFile, way, fmt.Sprint(n), fmt.Sprint(failAt)}, ","))
	return cmd.CombinedOutput()
}

// TestDesignFloorChild is the floor tests' child
// (QRPC_FLOOR_CHILD=addr,ca,way,n[,failAt]).
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
	if len(f) > 4 {
		if _, err := fmt.Sscan(f[4], &floorFailAt); err != nil {
			t.Fatal(err)
		}
	}
	c, err := dial(f[0], f[1])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := goSeq(c, min(n/10+1, warmupMax), 100); err != nil {
		t.Fatal(err)
	}
	if f[2] == "seq" {
		// the plain loop the floors' tests measure their bound with
		if _, err := goSeq(c, n, 100); err != nil {
			t.Fatal(err)
		}
		fmt.Println("floor: picks 0")
		return
	}
	_, picks, err := designFloor(c, n, 100, f[2])
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("floor: picks %d\n", picks)
}

// testCA is a CA and a loopback server certificate it issued.
func testCA(t *testing.T) (*certs.CA, certs.Pair) {
	t.Helper()
	ca, err := certs.NewCA("bench test ca")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue(certs.Options{Hosts: []string{"localhost", "127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	return ca, pair
}
