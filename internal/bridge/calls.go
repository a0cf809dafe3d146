package bridge

import (
	"sync"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Calls maps a host's call ids to started calls, so that CANCEL can forget
// one (the client aborted the HTTP request). Entries go away when the call
// completes. Sharded because completions remove entries from qrpc's
// reader goroutines while the nginx thread inserts. The zero value is
// ready to use.
type Calls struct {
	shards [callShards]callShard
}

type callShard struct {
	mu sync.Mutex
	m  map[uint64]*callEntry
	_  [48]byte // keep shards on separate cache lines
}

const callShards = 64

type callEntry struct {
	p         qrpc.Pending
	c         *conn
	started   bool // p and c are set
	cancelled bool // CANCEL came before started
}

func (t *Calls) shard(id uint64) *callShard {
	return &t.shards[id%callShards]
}

// insert adds a new entry; false when id is already in flight.
func (t *Calls) insert(id uint64, e *callEntry) bool {
	sh := t.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m == nil {
		sh.m = make(map[uint64]*callEntry)
	}
	if _, dup := sh.m[id]; dup {
		return false
	}
	sh.m[id] = e
	return true
}

// remove deletes id if it still maps to e (a completion racing a reuse of
// the id must not delete the newer entry).
func (t *Calls) remove(id uint64, e *callEntry) {
	sh := t.shard(id)
	sh.mu.Lock()
	if sh.m[id] == e {
		delete(sh.m, id)
	}
	sh.mu.Unlock()
}

// started records the Pending of a call once Start returned. A CANCEL that
// arrived in between (possible only with a caller outside the nginx
// thread) is applied now.
func (t *Calls) started(id uint64, e *callEntry, p qrpc.Pending, c *conn) {
	sh := t.shard(id)
	sh.mu.Lock()
	e.p, e.c, e.started = p, c, true
	cancel := e.cancelled
	sh.mu.Unlock()
	if cancel {
		c.cancel(p)
	}
}

// cancel forgets id. It reports whether the call was stopped before its
// completion was produced (then no completion will come).
func (t *Calls) cancel(id uint64) bool {
	sh := t.shard(id)
	sh.mu.Lock()
	e := sh.m[id]
	if e == nil {
		sh.mu.Unlock()
		return false
	}
	delete(sh.m, id)
	if !e.started {
		e.cancelled = true
		sh.mu.Unlock()
		return true
	}
	p, c := e.p, e.c
	sh.mu.Unlock()
	return c.cancel(p)
}

// cancelAll cancels every call; it returns how many were stopped. An
// entry's fields are read under its shard's lock only: started may be
// filling them in on another thread until the entry is out of the map and
// marked.
func (t *Calls) cancelAll() int {
	n := 0
	var run []callEntry
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		m := sh.m
		sh.m = nil
		run = run[:0]
		for _, e := range m {
			if e.started {
				run = append(run, callEntry{p: e.p, c: e.c})
			} else {
				e.cancelled = true
			}
		}
		sh.mu.Unlock()
		for _, e := range run {
			if e.c.cancel(e.p) {
				n++
			}
		}
	}
	return n
}

// Len counts entries.
func (t *Calls) Len() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
