// Package observe is how a qrpc pool reports what it does, per server, to
// this module's metrics (internal/metrics) and to tests, without the pool
// knowing about either. It is internal: the qrpc package's users configure
// pools, not recorders.
package observe

import "time"

// Observer is told what a pool does, per server, so that a metrics
// recorder (or a test) can count it without the pool knowing about either.
// Implementations must be cheap and must not block: they run on the call
// path (the nginx thread, in the c-shared library) and on the client's
// reader goroutines.
type Observer interface {
	// Peer is called once for every server that joins a pool, before any
	// other event of that server. It must not return nil.
	Peer(addr string) PeerObserver
}

// PeerObserver receives the events of one server of a pool.
type PeerObserver interface {
	// CallDone reports the outcome of one unary attempt on this server:
	// err == nil means the server answered with code (0 is success). An
	// attempt cancelled before its end (the caller's context cancelled, a
	// hedged copy that lost) is not reported; one whose deadline (the
	// call's, or the caller's context's) passed is, as a timeout; so is
	// one the server's connection refused at once (down, queue full).
	CallDone(method []byte, code uint32, err error, elapsed time.Duration)
	// EventDone reports a one-way event, once per event, on the server
	// that sent it or else on the last one that refused it: err == nil
	// means it was sent.
	EventDone(method []byte, err error)
	// InflightAdd moves the number of calls in flight on this server.
	InflightAdd(delta int)
	// StateChanged reports the server's new state.
	StateChanged(state PeerState)
	// Reconnected reports a connection to this server re-established.
	Reconnected()
	// Ejected reports a passive or active health ejection.
	Ejected()
	// Retried reports a call retried on another server after err, an
	// attempt's transport failure on this server.
	Retried(err error)
	// Hedged reports a copy of a call sent to another server because this
	// server had not answered it within the hedge delay.
	Hedged()
	// BudgetExhausted reports a retry or copy, after a failure or delay
	// of this server, refused by the pool's retry budget.
	BudgetExhausted()
	// BytesSent and BytesReceived count frame bytes on the wire.
	BytesSent(n int)
	BytesReceived(n int)
}

// PeerState is where a server of a pool stands.
type PeerState uint8

const (
	PeerConnecting PeerState = iota // dialling, or re-dialling after a loss
	PeerUp                          // takes calls
	PeerEjected                     // failed its health check; waits out its ejection
	PeerDraining                    // removed by re-resolution; finishes its calls, takes none
	PeerRemoved                     // gone from the pool
)

var peerStateNames = [...]string{"connecting", "up", "ejected", "draining", "removed"}

// String returns the name used in conn:peers() and in metric labels.
func (s PeerState) String() string {
	if int(s) < len(peerStateNames) {
		return peerStateNames[s]
	}
	return "unknown"
}

// Nop ignores everything; it is the Observer of a pool that has none.
type Nop struct{}

func (Nop) Peer(string) PeerObserver { return nopPeer{} }

type nopPeer struct{}

func (nopPeer) CallDone([]byte, uint32, error, time.Duration) {}
func (nopPeer) EventDone([]byte, error)                       {}
func (nopPeer) InflightAdd(int)                               {}
func (nopPeer) StateChanged(PeerState)                        {}
func (nopPeer) Reconnected()                                  {}
func (nopPeer) Ejected()                                      {}
func (nopPeer) Retried(error)                                 {}
func (nopPeer) Hedged()                                       {}
func (nopPeer) BudgetExhausted()                              {}
func (nopPeer) BytesSent(int)                                 {}
func (nopPeer) BytesReceived(int)                             {}
