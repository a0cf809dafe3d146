// Package ngxtest holds what the test suites that start a real nginx
// (nginx/ and rockspec/) share: finding the binary, picking its port, and
// judging its error.log. How each suite configures and runs nginx stays
// with the suite. Only tests import this package.
package ngxtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
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
// from a counter, so that parallel tests never pick the same one. The pid
// spreads the start so that test binaries running side by side (go test
// ./... runs packages in parallel) begin far apart.
var (
	portMu   sync.Mutex
	nextPort = 20000 + os.Getpid()%10000
)

// FreePort returns a port on 127.0.0.1 that nothing used a moment ago
// over TCP or UDP, so it serves nginx's HTTP and a QUIC server alike, and
// fails t when 1000 candidates in a row were taken.
func FreePort(t testing.TB) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for i := 0; i < 1000; i++ {
		p := nextPort
		nextPort++
		if nextPort >= 32000 {
			nextPort = 20000
		}
		addr := fmt.Sprintf("127.0.0.1:%d", p)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		_ = l.Close()
		c, err := net.ListenPacket("udp", addr)
		if err != nil {
			continue
		}
		_ = c.Close()
		return p
	}
	t.Fatal("no port free over TCP and UDP in 20000-32000")
	return 0
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
