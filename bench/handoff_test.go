package main

import (
	"runtime"
	"strings"
	"testing"
)

// The floor figure is only as good as its ping-pong: every round trip must
// complete (a lost wake-up would hang, bounded by the test timeout), and
// with one P the two threads cannot both block, which must be an error,
// not a hang.
func TestPingPong(t *testing.T) {
	old := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(old)
	if _, err := pingPongHere(10); err == nil || !strings.Contains(err.Error(), "GOMAXPROCS >= 2") {
		t.Fatalf("with 1 P: %v, want the GOMAXPROCS error", err)
	}
	runtime.GOMAXPROCS(2)
	d, err := pingPongHere(2000)
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 {
		t.Fatalf("2000 round trips took %v", d)
	}
}
