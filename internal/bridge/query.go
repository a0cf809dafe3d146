package bridge

import "fmt"

// QueryFunc answers one qrpc_query op on the calling thread. The blob it
// returns is copied into the host's memory.
type QueryFunc func(r *Runtime, cmd *Command) ([]byte, error)

// queries maps qrpc_query ops to their answers. Each feature registers its
// own from an init function (pools: PEERS; metrics, protobuf and configure
// theirs), so that adding one touches only its file.
var queries = map[uint32]QueryFunc{}

// RegisterQuery makes f answer op. Call it from init only.
func RegisterQuery(op uint32, f QueryFunc) {
	if _, dup := queries[op]; dup {
		panic(fmt.Sprintf("bridge: query op %d registered twice", op))
	}
	queries[op] = f
}

// Query runs a qrpc_query op.
func (r *Runtime) Query(cmd *Command) ([]byte, error) {
	f := queries[cmd.Op]
	if f == nil {
		return nil, Badf("op %d is not a query op", cmd.Op)
	}
	return f(r, cmd)
}
