package ngxtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestProblems(t *testing.T) {
	log := strings.Join([]string{
		`2024/01/01 00:00:00 [notice] 1#1: start worker processes`,
		`2024/01/01 00:00:00 [warn] 2#2: *1 qrpc: connection lost`,
		`2024/01/01 00:00:00 [error] 2#2: *1 qrpc: expected failure`,
		`2024/01/01 00:00:00 [error] 2#2: *2 lua entry thread aborted`,
		`2024/01/01 00:00:00 [crit] 2#2: *3 expected failure too`,
		`2024/01/01 00:00:00 [alert] 1#1: worker process 2 exited on signal 11`,
		`2024/01/01 00:00:00 [emerg] 1#1: unknown directive`,
		``,
	}, "\n")
	lines := strings.Split(log, "\n")
	expected := func(l string) bool { return strings.Contains(l, "expected failure") }
	for _, tc := range []struct {
		name    string
		allowed func(string) bool
		want    []string
	}{
		{"nothing allowed", nil, lines[2:7]},
		// An allowed pattern excuses [error] lines only, never [crit].
		{"expected errors allowed", expected, lines[3:7]},
	} {
		if got := Problems(log, tc.allowed); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got\n%s\nwant\n%s", tc.name, strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
		}
	}
	if got := Problems("[notice] fine\n[warn] also fine", nil); got != nil {
		t.Errorf("a clean log has problems: %q", got)
	}
}

func TestFreePortIsFreeAndNotRepeated(t *testing.T) {
	a, b := FreePort(t), FreePort(t)
	if a == b || a < 20000 || a >= 32000 || b < 20000 || b >= 32000 {
		t.Fatalf("ports %d and %d", a, b)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(a))
	if err != nil {
		t.Fatalf("port %d is not free: %v", a, err)
	}
	_ = l.Close()
}

// A port held over UDP alone (a QUIC socket) is not handed out: the demo
// test gives these ports to its qrpc server.
func TestFreePortSkipsUDPTaken(t *testing.T) {
	var next int
	withNextPort(func(n int) int { next = n; return n })
	c, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(next))
	if err != nil {
		t.Skipf("port %d is taken already: %v", next, err)
	}
	defer c.Close()
	if got := FreePort(t); got == next {
		t.Fatalf("FreePort gave %d, held over UDP", got)
	}
}

// The counter is the file's, shared by the test binaries of a run: set to
// 31000 here, another process's FreePort continues from it. Its own
// counter would start at 20000 + pid % 10000, below 30000.
func TestFreePortCountsAcrossProcesses(t *testing.T) {
	withNextPort(func(int) int { return 31000 })
	cmd := exec.Command(os.Args[0], "-test.run=^TestFreePortHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "QRPC_NGXTEST_PORT_HELPER=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`port=(\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("helper printed no port:\n%s", out)
	}
	got, _ := strconv.Atoi(string(m[1]))
	if got < 31000 || got >= 32000 {
		t.Fatalf("the other process got port %d, not from the shared counter (31000)", got)
	}
}

// TestFreePortHelperProcess is TestFreePortCountsAcrossProcesses's other
// process.
func TestFreePortHelperProcess(t *testing.T) {
	if os.Getenv("QRPC_NGXTEST_PORT_HELPER") != "1" {
		t.Skip("run by TestFreePortCountsAcrossProcesses")
	}
	fmt.Printf("port=%d\n", FreePort(t))
}
