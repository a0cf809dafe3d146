package qrpc

import (
	"net"
	"sync/atomic"
	"time"
)

// SetClockForTest makes c's deadline check of responses read now instead
// of time.Now; the returned function restores it.
func SetClockForTest(c *Client, now func() time.Time) (restore func()) {
	c.nowFn.Store(&now)
	return func() { c.nowFn.Store(nil) }
}

// SkipConfirmationForTest makes a Dial with cfg return as soon as the
// client's side of the handshake is done, without waiting for the server
// to confirm it. It returns cfg.
func SkipConfirmationForTest(cfg *Config) *Config {
	cfg.skipConfirmation = true
	return cfg
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

// RawNetworksForTest says which of the server's and the client's sockets
// do their I/O with raw system calls (rawIO): "udp4" or "udp6" each, ""
// for one that does not.
func RawNetworksForTest(s *Server, c *Client) (server string, client []string) {
	s.mu.Lock()
	if sock, ok := s.tr.Conn.(*udpSocket); ok && sock.raw != nil {
		server = sock.raw.network
	}
	s.mu.Unlock()
	for _, sl := range c.slots {
		if st := sl.cur.Load(); st != nil && st.sock != nil {
			n := ""
			if st.sock.raw != nil {
				n = st.sock.raw.network
			}
			client = append(client, n)
		}
	}
	return server, client
}

// DeadlinesForTest counts the calls the client's live connections are
// timing (their deadline heaps).
func DeadlinesForTest(c *Client) int {
	n := 0
	for _, sl := range c.slots {
		if s := sl.cur.Load(); s != nil {
			n += s.deadlines.len()
		}
	}
	return n
}

// DeadlineShards is how many deadline heaps (and timers) a connection has.
const DeadlineShards = deadlineShards

// ResetKeyFromCertificate is the key a server derives from its
// certificate, for the tests that build servers around their own sockets.
var ResetKeyFromCertificate = resetKeyFromCertificate

// StreamIDsForTest lists the QUIC stream ids of c's streams in service
// (not retired), over its live connections.
func StreamIDsForTest(c *Client) []int64 {
	var out []int64
	for _, sl := range c.slots {
		s := sl.cur.Load()
		if s == nil || s.dead.Load() {
			continue
		}
		for i := range s.streams {
			if st := s.streams[i].Load(); st != nil && !st.retired.Load() {
				out = append(out, int64(st.s.StreamID()))
			}
		}
	}
	return out
}

// offsetClock is the real clock moved on by what a test adds.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) AfterFunc(d time.Duration, f func()) timer {
	return time.AfterFunc(d, f)
}

// ShiftPoolClockForTest gives p a clock that a test can move forward
// (the returned function), for windows minutes long. Call it before the
// pool's first call, on a pool without background checks.
func ShiftPoolClockForTest(p *Pool) (advance func(time.Duration)) {
	c := &offsetClock{}
	p.clk = c
	return func(d time.Duration) { c.off.Add(int64(d)) }
}

// WireForTest reports, for the client's first live connection, the
// datagrams quic-go sent, the probes sent beside them, and the smoothed
// RTT (ok false when no connection is live).
func WireForTest(c *Client) (sends, probes uint64, srtt time.Duration, ok bool) {
	for _, sl := range c.slots {
		if s := sl.cur.Load(); s != nil && s.sock != nil {
			return s.sock.sends.Load(), s.sock.probes.Load(), s.conn.ConnectionStats().SmoothedRTT, true
		}
	}
	return 0, 0, 0, false
}
