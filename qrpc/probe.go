package qrpc

import (
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// A server killed while calls wait for their answers leaves the client's
// connection quiet: the requests were acknowledged, so nothing is sent
// again, and the ICMP port unreachable that would end the connection at
// once (udpSocket) comes only for a packet sent to the dead port. Without
// one the calls wait for their deadlines. So while calls are in flight a
// connection that sent nothing for a probe interval sends a probe
// (udpSocket.probe: a datagram a live server's QUIC stack drops and a
// closed port refuses): a crash is heard within two intervals, a round
// trip and refusalGrace. A busy connection's own packets do the probes'
// work, and an idle one (no call in flight) runs no timer.

// Bounds of the probe interval, which is the connection's smoothed RTT
// within them: probing faster than a round trip learns nothing sooner,
// and slower would let a crash go unheard for longer than about
// 100 ms plus a round trip.
const (
	minProbeEvery = 20 * time.Millisecond
	// MaxProbeInterval is the longest: a crash is heard within two of
	// them, a round trip and the refusal's grace.
	MaxProbeInterval = 50 * time.Millisecond
)

func (s *qconn) probeEvery() time.Duration {
	return min(max(s.conn.ConnectionStats().SmoothedRTT, minProbeEvery), MaxProbeInterval)
}

// startProbing starts the probe timer, unless it runs (Start calls it on
// a call's way out when probing is false).
func (s *qconn) startProbing() {
	if s.sock == nil || !s.sock.recvErr || s.dead.Load() || !s.probing.CompareAndSwap(false, true) {
		return
	}
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	d := s.probeEvery()
	s.probeSeen = s.sock.sends.Load()
	if s.probeT == nil {
		// After a panic of a tick, the next call starts the timer again.
		s.probeT = safego.AfterFunc("probe timer", d, s.probeTick, func() { s.probing.Store(false) })
		return
	}
	s.probeT.Reset(d)
}

// probeTick sends a probe when the connection sent nothing since the last
// tick, and re-arms while calls are in flight.
func (s *qconn) probeTick() {
	if s.dead.Load() {
		return
	}
	if s.callsInFlight() == 0 {
		// A call that starts now finds probing false and starts the
		// timer itself, or this tick goes on.
		s.probing.Store(false)
		if s.callsInFlight() == 0 || !s.probing.CompareAndSwap(false, true) {
			return
		}
	}
	safego.Inject("probe timer")
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	if s.sock.sends.Load() == s.probeSeen {
		s.sock.probe()
	}
	s.probeSeen = s.sock.sends.Load()
	s.probeT.Reset(s.probeEvery())
}

func (s *qconn) stopProbing() {
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	if s.probeT != nil {
		s.probeT.Stop()
	}
}

// callsInFlight counts the calls of the streams in service.
func (s *qconn) callsInFlight() int64 {
	var n int64
	for i := range s.streams {
		if st := s.streams[i].Load(); st != nil {
			n += st.inflight.Load()
		}
	}
	return n
}
