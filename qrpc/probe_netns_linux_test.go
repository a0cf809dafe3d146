package qrpc_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// remoteListener returns a function that opens a UDP socket in a network
// namespace of the test's own, reached from this one over a veth pair:
// what the kernel does for a remote host (rate-limiting the ICMP errors it
// sends there) it does for this one, which it does not over loopback.
// Without root or ip(8) the sockets are on 127.0.0.1, and the test says so.
// Each of a test's namespaces (n, 0 to 63) is a host of its own: the
// kernel's ICMP budgets for this host are its own.
func remoteListener(t *testing.T, n int) func() *net.UDPConn {
	t.Helper()
	loopback := func() *net.UDPConn {
		pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		return pc
	}
	if os.Geteuid() != 0 {
		t.Log("not root: the servers are on loopback, where ICMP is not rate-limited")
		return loopback
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Log("no ip(8): the servers are on loopback, where ICMP is not rate-limited")
		return loopback
	}
	// Names and addresses from the pid: test processes running at once
	// (other packages, other checkouts) each have their own.
	id := os.Getpid() % 100000
	ns, host, peer := fmt.Sprintf("qrpct%d_%d", id, n), fmt.Sprintf("qrh%d_%d", id, n), fmt.Sprintf("qrp%d_%d", id, n)
	netw := fmt.Sprintf("10.%d.%d.", 64+(id>>8)%128, id&255)
	hostIP, peerIP := netw+strconv.Itoa(4*n+1), netw+strconv.Itoa(4*n+2)
	run := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	cleanup := func() {
		_ = run("link", "del", host)
		_ = run("netns", "del", ns)
	}
	cleanup() // a namespace left by a killed run of this pid
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns},
		{"addr", "add", hostIP + "/30", "dev", host},
		{"link", "set", host, "up"},
		{"-n", ns, "addr", "add", peerIP + "/30", "dev", peer},
		{"-n", ns, "link", "set", peer, "up"},
		{"-n", ns, "link", "set", "lo", "up"},
	} {
		if err := run(args...); err != nil {
			cleanup()
			t.Logf("no network namespace (%v): the servers are on loopback, where ICMP is not rate-limited", err)
			return loopback
		}
	}
	t.Cleanup(cleanup)
	return func() *net.UDPConn {
		t.Helper()
		var pc *net.UDPConn
		var err error
		done := make(chan struct{})
		go func() {
			defer close(done)
			// The thread stays locked: it ends with this goroutine, and
			// the namespace it entered with it.
			runtime.LockOSThread()
			f, ferr := os.Open("/var/run/netns/" + ns)
			if ferr != nil {
				err = ferr
				return
			}
			defer f.Close()
			if err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				return
			}
			pc, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(peerIP)})
		}()
		<-done
		if err != nil {
			t.Fatal(err)
		}
		return pc
	}
}
