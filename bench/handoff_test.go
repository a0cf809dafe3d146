package main

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// The floor figure is only as good as its ping-pong: every round trip must
// complete, and with one P the two threads cannot both block, which must
// be an error, not a hang.
func TestPingPong(t *testing.T) {
	old := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(old)
	if _, err := pingPongHere(10); err == nil || !strings.Contains(err.Error(), "GOMAXPROCS >= 2") {
		t.Fatalf("with 1 P: %v, want the GOMAXPROCS error", err)
	}
	// The round trips run in a child: its threads hold their Ps while
	// blocked in raw reads, so a lost wake-up would also stop its garbage
	// collector and every timer in it. From here it is killed instead.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPingPongChild$", "-test.count=1")
	cmd.Env = append(withoutEnv(os.Environ(), "GOMAXPROCS"), "GOMAXPROCS=2", "QRPC_PINGPONG_CHILD=1")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("2000 round trips not done in 30 s: a wake-up was lost\n%s", out)
	}
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "round trips: 2000") {
		t.Fatalf("child did not run the round trips:\n%s", out)
	}
}

// TestPingPongChild is TestPingPong's child (QRPC_PINGPONG_CHILD=1).
func TestPingPongChild(t *testing.T) {
	if os.Getenv("QRPC_PINGPONG_CHILD") == "" {
		t.Skip("run by TestPingPong")
	}
	d, err := pingPongHere(2000)
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 {
		t.Fatalf("2000 round trips took %v", d)
	}
	os.Stdout.WriteString("round trips: 2000\n")
}
