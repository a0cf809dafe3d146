package bridge

import (
	"fmt"
	"sync"
)

// QueryFunc answers one query op (QRPC_OP_PEERS and above) synchronously,
// on the caller's thread (the nginx worker's): it must not block on the
// network. Its result is copied once into the host's memory; its error is
// mapped by StatusOf (wrap ErrBadCommand for a caller's mistake).
type QueryFunc func(r *Runtime, cmd *Command) ([]byte, error)

var (
	queryMu sync.RWMutex
	queries = map[uint32]QueryFunc{}
)

// RegisterQuery makes fn answer op. Each feature registers its op from an
// init function in its own file. It panics on an op that is not a query op
// or already has a function: both are bugs of the build, not of a caller.
func RegisterQuery(op uint32, fn QueryFunc) {
	if op <= lastSubmitOp || op > lastOp || fn == nil {
		panic(fmt.Sprintf("bridge.RegisterQuery: op %d is not a query op (%d..%d), or no function", op, lastSubmitOp+1, lastOp))
	}
	queryMu.Lock()
	defer queryMu.Unlock()
	if _, dup := queries[op]; dup {
		panic(fmt.Sprintf("bridge.RegisterQuery: op %d registered twice", op))
	}
	queries[op] = fn
}

// unregisterQuery is for tests that register their own op.
func unregisterQuery(op uint32) {
	queryMu.Lock()
	defer queryMu.Unlock()
	delete(queries, op)
}

// Query runs a query op now. On success the completion's Data holds the
// result (Len bytes, possibly 0) in the runtime's Memory, owned by the
// caller; otherwise its Status is an error and msg says why (no Data).
func (r *Runtime) Query(cmd *Command) (out Completion, msg string) {
	if err := cmd.Check(); err != nil {
		out.Status, msg = StatusOf(err)
		return out, msg
	}
	if cmd.Op <= lastSubmitOp {
		return Completion{Status: ErrBadArg}, fmt.Sprintf("bad command: op %d is not a query: use qrpc_submit_async", cmd.Op)
	}
	queryMu.RLock()
	fn := queries[cmd.Op]
	queryMu.RUnlock()
	if fn == nil {
		return Completion{Status: ErrBadArg}, fmt.Sprintf("unsupported op %d", cmd.Op)
	}
	b, err := fn(r, cmd)
	if err != nil {
		out.Status, msg = StatusOf(err)
		return out, msg
	}
	p := r.mem.Alloc(len(b))
	if p == nil {
		return Completion{Status: ErrGeneric}, "out of memory"
	}
	copy(Bytes(p, len(b)), b)
	return Completion{Status: StatusOK, Data: p, Len: uintptr(len(b))}, ""
}
