package qrpc

import (
	"sync"
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
// closed port refuses): a crash is heard within about two intervals, a
// round trip and refusalGrace. A busy connection's own packets do the
// probes' work, and with no call in flight anywhere no timer runs.
//
// One timer serves every connection of the process: a timer each cost a
// goroutine wake-up per probe, about 17 µs of CPU (measured: 100 quiet
// connections probing 48 times a second took 8-9 % of a core).

// Bounds of a connection's probe interval, which is its smoothed RTT
// within them: probing faster than a round trip learns nothing sooner,
// and slower would let a crash go unheard for longer than about 100 ms
// plus a round trip.
const (
	minProbeEvery = 20 * time.Millisecond
	// MaxProbeInterval is the longest: a crash is heard within two of
	// them, a round trip and the refusal's grace.
	MaxProbeInterval = 50 * time.Millisecond
)

func (s *qconn) probeEvery() time.Duration {
	return min(max(s.conn.ConnectionStats().SmoothedRTT, minProbeEvery), MaxProbeInterval)
}

// prober is the process's probe timer and the connections it serves
// (each with calls in flight, or just without: the next tick lets it go).
type prober struct {
	mu    sync.Mutex
	conns map[*qconn]struct{}
	timer *time.Timer
	armed bool // the timer is set, or its tick runs
}

var probes = prober{conns: map[*qconn]struct{}{}}

// startProbing has the prober serve s (Start calls it when probing is
// false: the call it starts is in flight).
func (s *qconn) startProbing() {
	if s.sock == nil || !s.sock.recvErr || s.dead.Load() || !s.probing.CompareAndSwap(false, true) {
		return
	}
	p := &probes
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[s] = struct{}{}
	if !p.armed {
		p.armed = true
		if p.timer == nil {
			// After a panic of a tick the timer is set again by the next
			// connection that starts probing.
			p.timer = safego.AfterFunc("probe timer", minProbeEvery, p.tick, p.disarm)
		} else {
			p.timer.Reset(minProbeEvery)
		}
	}
}

func (p *prober) disarm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = false
	for s := range p.conns {
		s.probing.Store(false)
		delete(p.conns, s)
	}
}

// tick probes each connection that has calls in flight, sent nothing
// since its last probe interval and is due, and lets the others go.
func (p *prober) tick() {
	now := time.Now()
	p.mu.Lock()
	due := make([]*qconn, 0, len(p.conns))
	for s := range p.conns {
		if !s.dead.Load() && s.callsInFlight() > 0 {
			due = append(due, s)
			continue
		}
		// A call that starts now finds probing false and adds s again
		// (under mu: after this), or the count below sees it.
		s.probing.Store(false)
		if s.dead.Load() || s.callsInFlight() == 0 || !s.probing.CompareAndSwap(false, true) {
			delete(p.conns, s)
		}
	}
	p.mu.Unlock()
	safego.Inject("probe timer")
	for _, s := range due {
		// probeAt and probeSeen are the ticks' alone: one runs at a time.
		if now.Sub(s.probeAt) < s.probeEvery() {
			continue
		}
		s.probeAt = now
		if sends := s.sock.sends.Load(); sends != s.probeSeen {
			s.probeSeen = sends
			continue
		}
		s.sock.probe()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.conns) == 0 {
		p.armed = false
		return
	}
	p.timer.Reset(minProbeEvery)
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
