// Package ngxtest holds what the test suites that start a real nginx
// (nginx/ and rockspec/) share: finding the binary, picking its port, and
// judging its error.log. How each suite configures and runs nginx stays
// with the suite. Only tests import this package.
package ngxtest

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// LookPath finds name on PATH, then in /usr/sbin: Debian installs nginx
// there, and a non-root user's PATH often lacks it. It returns an error
// rather than failing a test because nginx/ decides in TestMain whether to
// skip the whole suite.
func LookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	p := "/usr/sbin/" + name
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s is neither on PATH nor in /usr/sbin", name)
	}
	return p, nil
}

// Ports for nginx come from below Linux's ephemeral range (32768 and up),
// where outgoing connections of this very test run cannot take them, and
// from a counter that every test binary of the run shares (go test ./...
// runs packages in parallel): a file in the temporary directory, under
// flock. Why shared: each binary once counted on its own from a start
// spread by its pid, the binaries of one run have close pids, and one's
// probe of a port (a listen and a close) made the other's nginx fail its
// first bind() of the same port: an [emerg] in its error.log, a failed
// test. Without the file (no temporary directory, no
// flock) the counter is this process's own.
const (
	portLow  = 20000
	portHigh = 32000 // exclusive
)

var (
	portMu   sync.Mutex
	nextPort = portLow + os.Getpid()%10000
	portFile = filepath.Join(os.TempDir(), "qrpc-ngxtest-next-port")
)

// withNextPort runs f on the shared counter's value and stores what f
// returns, holding the file's lock (and this process's mutex) meanwhile.
func withNextPort(f func(next int) int) {
	portMu.Lock()
	defer portMu.Unlock()
	fh, err := os.OpenFile(portFile, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		nextPort = f(nextPort)
		return
	}
	defer func() { _ = fh.Close() }()
	if err := syscall.Flock(int(fh.Fd()), syscall.LOCK_EX); err != nil {
		nextPort = f(nextPort)
		return
	}
	defer func() { _ = syscall.Flock(int(fh.Fd()), syscall.LOCK_UN) }()
	b, _ := io.ReadAll(fh)
	next, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || next < portLow || next >= portHigh {
		next = nextPort
	}
	next = f(next)
	nextPort = next
	if err := fh.Truncate(0); err == nil {
		_, _ = fh.WriteAt([]byte(strconv.Itoa(next)), 0)
	}
}

// FreePort returns a port on 127.0.0.1 that nothing used a moment ago
// over TCP or UDP, so it serves nginx's HTTP and a QUIC server alike, and
// fails t when 1000 candidates in a row were taken.
func FreePort(t testing.TB) int {
	t.Helper()
	port := 0
	withNextPort(func(next int) int {
		for i := 0; i < 1000; i++ {
			p := next
			next++
			if next >= portHigh {
				next = portLow
			}
			if portFree(p) {
				port = p
				break
			}
		}
		return next
	})
	if port == 0 {
		t.Fatalf("no port free over TCP and UDP in %d-%d", portLow, portHigh)
	}
	return port
}

func portFree(p int) bool {
	addr := fmt.Sprintf("127.0.0.1:%d", p)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	_ = l.Close()
	c, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

var severe = regexp.MustCompile(`\[(alert|crit|emerg)\]`)

// Problems returns the error.log lines a test must fail on: every [alert],
// [crit] and [emerg], and every [error] that allowed does not accept
// (allowed nil accepts none). Tests that provoke errors on purpose pass
// allowed; nothing excuses the levels above [error].
func Problems(log string, allowed func(line string) bool) []string {
	var bad []string
	for _, line := range strings.Split(log, "\n") {
		if severe.MatchString(line) {
			bad = append(bad, line)
			continue
		}
		if strings.Contains(line, "[error]") && (allowed == nil || !allowed(line)) {
			bad = append(bad, line)
		}
	}
	return bad
}
