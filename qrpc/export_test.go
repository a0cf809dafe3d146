package qrpc

import (
	"net"
	"time"
)

// SetClockForTest makes the client's deadline check of responses read now
// instead of time.Now; the returned function restores it.
func SetClockForTest(now func() time.Time) (restore func()) {
	clock.Store(&now)
	return func() { clock.Store(nil) }
}

// SkipConfirmationForTest makes Dial return as soon as the client's side of
// the handshake is done, without waiting for the server to confirm it.
func SkipConfirmationForTest() (restore func()) {
	skipConfirmation.Store(true)
	return func() { skipConfirmation.Store(false) }
}

// LocalAddrsForTest returns the local addresses of the client's live
// connections (their UDP sockets).
func LocalAddrsForTest(c *Client) []*net.UDPAddr {
	var out []*net.UDPAddr
	for _, sl := range c.slots {
		if s := sl.cur.Load(); s != nil && s.sock != nil {
			out = append(out, s.sock.LocalAddr().(*net.UDPAddr))
		}
	}
	return out
}
