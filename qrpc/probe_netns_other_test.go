//go:build !linux

package qrpc_test

import (
	"net"
	"testing"
)

// remoteListener: network namespaces are Linux's; elsewhere the sockets
// are on loopback.
func remoteListener(t *testing.T, _ int) func() *net.UDPConn {
	return func() *net.UDPConn {
		pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		return pc
	}
}
