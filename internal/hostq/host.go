// Package hostq is the built-in host of libffi_qrpc.so (the one for stock
// nginx + ngx_lua): its queues in C (hostq.c: the submit queue, the
// completion queue, the caches of blocks), their Go side (the submitter,
// the waker), the wake-up socket, C memory for the runtime, the signal
// forwarders and the check of qrpc.h's layout. ffi/ exports it.
//
// The queues are C globals: a process has one built-in host (Builtin) and
// one runtime (Runtime), which the lua-resty-ffi host shares.
package hostq

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
)

// maxQueuedLogs bounds the log lines waiting in the completion queue: with
// a dead dispatcher, logs must not grow without limit. Beyond it lines are
// dropped and counted.
const maxQueuedLogs = 1000

// Host is the host for stock nginx + ngx_lua: Lua submits through the C
// submit queue (qrpc_submit_async, queue.go), completions wait in a
// queue in C that qrpc_poll empties, and the first completion after the
// queue was empty writes one byte to the dispatcher's unix socket. It is
// the runtime's bridge.Host for every command of both, and for the EVENT
// and CLOSE that qrpc_query runs at once (RunNow).
type Host struct {
	mu sync.Mutex // orders init and shutdown
	// nil when not initialised (or shut down); atomic, because every
	// command reads it (Gen) and a mutex there was 1-2 % of the nginx
	// thread's time on an echo answered inside a Go export
	gen atomic.Pointer[bridge.Gen]

	logDrops       atomic.Uint64
	lastDropReport atomic.Int64 // unix nanoseconds
	calls          bridge.Calls
	wake           wakeState
	submitq        submitter
}

var builtin = &Host{}

// rt is the one runtime of the process (= nginx worker), shared by both
// hosts. Its log lines go through the built-in host's queue when it is
// open.
// (Set in init: the sink refers back to rt.)
var rt *bridge.Runtime

func init() {
	rt = bridge.New(cmem, func(level uint32, line string) bool { return builtin.pushLog(level, line) })
}

// Builtin is the process's built-in host.
func Builtin() *Host { return builtin }

// Runtime is the process's runtime.
func Runtime() *bridge.Runtime { return rt }

// goEntries counts the calls that entered Go through the exports: the
// built-in host's hot path (qrpc_submit_async, qrpc_poll, qrpc_release in
// hostq.c) must not add to it, which the nginx tests check with
// qrpc_go_entries.
var goEntries atomic.Uint64

// inExport counts the threads inside an export. A completion pushed there
// (a log line) wakes the dispatcher at once: readying
// the waker goroutine from the nginx thread would leave it on the P that
// thread keeps while it runs nginx (see queue.go).
var inExport atomic.Int32

// EnterExport and LeaveExport bracket every export.
func EnterExport() {
	goEntries.Add(1)
	inExport.Add(1)
}

func LeaveExport() { inExport.Add(-1) }

// GoEntries is how many calls entered Go through the exports.
func GoEntries() uint64 { return goEntries.Load() }

var errNotInit = errors.New("closed: qrpc_init was not called (or qrpc_shutdown was)")

// Init opens the host; a no-op when it is already open.
func (b *Host) Init() error {
	if err := CheckLayout(); err != nil {
		return fmt.Errorf("libffi_qrpc.so does not match qrpc.h: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gen.Load() == nil {
		if err := b.submitq.start(); err != nil {
			return err
		}
		b.gen.Store(bridge.NewGen())
	}
	return nil
}

// Gen, Calls, Queued and Complete make the host a bridge.Host.
func (b *Host) Gen() (*bridge.Gen, error) {
	g := b.gen.Load()
	if g == nil {
		return nil, errNotInit
	}
	return g, nil
}

func (b *Host) Calls() *bridge.Calls { return &b.calls }

func (b *Host) Queued() int { return cqLen() }

// Complete queues a completion (the host is closed: frees it).
func (b *Host) Complete(c bridge.Completion) {
	if !b.enqueue(c) {
		rt.Free(&c)
	}
}

// enqueue appends c and wakes the dispatcher when the queue was empty;
// false when the host is closed. Called from qrpc's goroutines and from
// the nginx thread.
func (b *Host) enqueue(c bridge.Completion) bool {
	switch b.push(&c) {
	case 0:
	case -2:
		// Out of memory: the call's waiter times out in Lua.
		rt.Free(&c)
	default:
		return false
	}
	return true
}

// push queues c in C and has the dispatcher woken when the queue was
// empty. Returns 0 when queued, -1 when the host is closed, -2 when
// refused (no memory, or too many log lines): c is then still the
// caller's.
func (b *Host) push(c *bridge.Completion) int {
	rc := cqPush(c, maxQueuedLogs)
	if rc == 1 {
		b.wakeSoon()
		rc = 0
	}
	return rc
}

// wakeSoon has the waker goroutine (queue.go) write the wake byte once the
// goroutines runnable now have run: the answers of one datagram batch
// complete their calls one goroutine after another, and a byte written
// for the first woke the nginx thread for that one completion while the
// others were still on their way (on one CPU it preempted Go at once).
// Inside an export, or with the submitter stopped, it writes at once.
func (b *Host) wakeSoon() {
	if inExport.Load() == 0 {
		if k := b.submitq.kick.Load(); k != nil {
			select {
			case *k <- struct{}{}:
			default: // a kick is pending: its byte comes after this push
			}
			return
		}
	}
	b.wake.signal()
}

// pushLog queues a log line (the runtime's LogSink); false when the host
// is not open (the line then goes to stderr).
func (b *Host) pushLog(level uint32, line string) bool {
	open := b.gen.Load() != nil
	if !open {
		return false
	}
	if cqLogs() >= maxQueuedLogs {
		b.dropLog()
		return true
	}
	c := rt.Message(bridge.StatusLog, line, 0)
	if c.Data == nil {
		b.dropLog()
		return true
	}
	c.Code = level
	// The queue checks the bound again, under its lock.
	switch b.push(&c) {
	case 0:
	case -2:
		rt.Free(&c)
		b.dropLog()
	default:
		rt.Free(&c) // shut down meanwhile
	}
	return true
}

// dropLog counts a dropped line and says so on stderr, at most every
// logDropReport: the queue is full of logs only when nobody drains it.
func (b *Host) dropLog() {
	n := b.logDrops.Add(1)
	now := time.Now().UnixNano()
	last := b.lastDropReport.Load()
	if now-last >= int64(logDropReport) && b.lastDropReport.CompareAndSwap(last, now) {
		bridge.StderrLog(bridge.NgxLogWarn, fmt.Sprintf("qrpc: %d log lines dropped so far: the completion queue is not being drained", n))
	}
}

const logDropReport = 10 * time.Second

// Drain moves up to len(out) completions into out.
func (b *Host) Drain(out []bridge.Completion) int { return cqPoll(out) }

// Shutdown fails nothing into the void: pending calls are cancelled (no
// completion will be produced), queued completions are freed, the host's
// connections are closed in the background, and the wake socket closed.
func (b *Host) Shutdown() {
	// First, while the host is open: queued calls start (or are refused)
	// before the generation ends, which then cancels them like the others.
	// Closes the completion queue too.
	b.submitq.halt()
	b.mu.Lock()
	gen := b.gen.Swap(nil)
	b.mu.Unlock()
	var q [64]bridge.Completion
	for n := cqPoll(q[:]); n > 0; n = cqPoll(q[:]) {
		for i := range q[:n] {
			rt.Free(&q[i])
		}
	}
	if gen != nil {
		rt.EndGen(gen, &b.calls, false)
	}
	b.wake.close()
}

// WakeOpen creates a new wake-up socket in dir (qrpc_wake_open): room is
// the caller's buffer for its path, NUL included. Completions queued
// before the dispatcher connects are announced once it has.
func (b *Host) WakeOpen(dir string, room int) (string, error) {
	return b.wake.open(dir, room, func() {
		if b.Queued() > 0 {
			b.wake.signal()
		}
	})
}

// RunNow runs a command at once on the calling thread (qrpc_query): EVENT
// and CLOSE, whose outcome their caller needs before it goes on, and the
// query ops. On success the completion's Data, if any, is the caller's;
// otherwise its Status is an error and msg says why.
func (b *Host) RunNow(c *bridge.Command) (bridge.Completion, string) {
	if c.Op == bridge.OpEvent || c.Op == bridge.OpClose {
		st, msg := rt.Submit(b, c)
		return bridge.Completion{Status: st}, msg
	}
	return rt.Query(c)
}
