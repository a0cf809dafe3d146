package qrpc

import "github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/observe"

// PeerState is where a server of a pool stands (PeerInfo.State).
type PeerState = observe.PeerState

// The states of a pool's server.
const (
	PeerConnecting = observe.PeerConnecting // dialling, or re-dialling after a loss
	PeerUp         = observe.PeerUp         // takes calls
	PeerEjected    = observe.PeerEjected    // failed its health check; waits out its ejection
	PeerDraining   = observe.PeerDraining   // removed by re-resolution; finishes its calls, takes none
	PeerRemoved    = observe.PeerRemoved    // gone from the pool
)

// peerObserver receives the reports of one server of a pool for this
// module's metrics (internal/observe).
type peerObserver = observe.PeerObserver
