package main

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// maxQueuedLogs bounds the log lines waiting in the completion queue: with
// a dead dispatcher, logs must not grow without limit. Beyond it lines are
// dropped and counted.
const maxQueuedLogs = 1000

// builtinHost is the host for stock nginx + ngx_lua: Lua submits through
// qrpc_submit, completions wait in a queue, and the first completion
// after the queue was empty writes one byte to the dispatcher's unix
// socket.
type builtinHost struct {
	mu   sync.Mutex
	gen  *hostGen // nil when not initialised (or shut down)
	q    []completion
	head int
	logs int // QRPC_LOG entries in q

	logDrops       atomic.Uint64
	lastDropReport atomic.Int64 // unix nanoseconds
	calls          callTable
	wake           wakeState
}

var builtin = &builtinHost{}

var errNotInit = errors.New("closed: qrpc_init was not called (or qrpc_shutdown was)")

// init opens the host; a no-op when it is already open.
func (b *builtinHost) init() error {
	if err := checkLayout(); err != nil {
		return fmt.Errorf("libffi_qrpc.so does not match qrpc.h: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gen == nil {
		b.gen = newGen()
	}
	return nil
}

func (b *builtinHost) current() *hostGen {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gen
}

// push queues a completion and wakes the dispatcher when the queue was
// empty. Called from qrpc's goroutines and from the nginx thread.
func (b *builtinHost) push(c completion) {
	b.mu.Lock()
	if b.gen == nil {
		b.mu.Unlock()
		c.free()
		return
	}
	wasEmpty := b.head == len(b.q)
	b.q = append(b.q, c)
	b.mu.Unlock()
	if wasEmpty {
		b.wake.signal()
	}
}

// pushLog queues a log line; false when the host is not open (the caller
// then writes the line to stderr).
func (b *builtinHost) pushLog(level uint32, line string) bool {
	b.mu.Lock()
	if b.gen == nil {
		b.mu.Unlock()
		return false
	}
	if b.logs >= maxQueuedLogs {
		b.mu.Unlock()
		b.dropLog()
		return true
	}
	b.logs++
	b.mu.Unlock()
	p, n := cMessage(line)
	if p == nil {
		b.mu.Lock()
		b.logs--
		b.mu.Unlock()
		b.dropLog()
		return true
	}
	c := completion{status: statusLog, code: level, data: p, n: n}
	b.mu.Lock()
	if b.gen == nil {
		b.logs = 0
		b.mu.Unlock()
		c.free()
		return true
	}
	wasEmpty := b.head == len(b.q)
	b.q = append(b.q, c)
	b.mu.Unlock()
	if wasEmpty {
		b.wake.signal()
	}
	return true
}

// dropLog counts a dropped line and says so on stderr, at most every
// logDropReport: the queue is full of logs only when nobody drains it.
func (b *builtinHost) dropLog() {
	n := b.logDrops.Add(1)
	now := time.Now().UnixNano()
	last := b.lastDropReport.Load()
	if now-last >= int64(logDropReport) && b.lastDropReport.CompareAndSwap(last, now) {
		stderrLog(ngxLogWarn, fmt.Sprintf("qrpc: %d log lines dropped so far: the completion queue is not being drained", n))
	}
}

const logDropReport = 10 * time.Second

// drain moves up to len(out) completions into out.
func (b *builtinHost) drain(out []completionABI) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := min(len(out), len(b.q)-b.head)
	for i := 0; i < n; i++ {
		c := &b.q[b.head+i]
		out[i] = completionABI{CallID: c.callID, Handle: c.handle, Status: c.status, Code: c.code, Data: c.data, Len: uintptr(c.n)}
		if c.status == statusLog {
			b.logs--
		}
		*c = completion{}
	}
	b.head += n
	switch {
	case b.head == len(b.q):
		b.q, b.head = b.q[:0], 0
	case b.head > 4096 && 2*b.head > len(b.q):
		k := copy(b.q, b.q[b.head:])
		clear(b.q[k:])
		b.q, b.head = b.q[:k], 0
	}
	return n
}

func (b *builtinHost) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.q) - b.head
}

// submit runs one command for qrpc_submit. It never blocks: CONNECT dials
// on a goroutine, UNARY is encoded and queued on the calling thread.
func (b *builtinHost) submit(c *cmdABI) (int32, string) {
	cmd, err := decodeCmd(c)
	if err != nil {
		return statusOf(err)
	}
	gen := b.current()
	if gen == nil {
		return errClosed, errNotInit.Error()
	}
	if testHook != nil {
		testHook("submit")
	}
	switch cmd.op {
	case opConnect:
		addr, cfg := connectConfig(&cmd, rt.logger)
		callID := cmd.callID
		go func() {
			defer recoverLog("connect")
			var out completion
			if cn, err := rt.dial(gen, addr, cfg); err != nil {
				out = errCompletion(err)
			} else {
				out = completion{status: statusOK, handle: cn.handle}
			}
			out.callID = callID
			b.push(out)
		}()
		return statusPending, ""
	case opUnary:
		return b.unary(&cmd)
	case opEvent:
		return statusOf(rt.event(&cmd))
	case opClose:
		return statusOf(rt.closeConn(cmd.conn))
	case opCancel:
		b.calls.cancel(cmd.callID)
		return statusOK, ""
	case opEcho:
		out := resultCompletion(0, nil, cmd.body)
		out.callID = cmd.callID
		b.push(out)
		return statusPending, ""
	case opStats:
		s, err := rt.stats(cmd.conn, b.queued())
		if err != nil {
			return statusOf(err)
		}
		out := statsCompletion(s)
		out.callID = cmd.callID
		b.push(out)
		return statusPending, ""
	}
	return errBadArg, fmt.Sprintf("bad command: unknown op %d", cmd.op)
}

func (b *builtinHost) unary(cmd *command) (int32, string) {
	id := cmd.callID
	e := &callEntry{}
	if !b.calls.insert(id, e) {
		return errBadArg, fmt.Sprintf("bad command: call_id %d is already in flight", id)
	}
	p, c, err := rt.startUnary(cmd, func(out completion) {
		b.calls.remove(id, e)
		out.callID = id
		b.push(out)
	})
	if err != nil {
		b.calls.remove(id, e)
		return statusOf(err)
	}
	b.calls.started(id, e, p, c)
	return statusPending, ""
}

// stats fills qrpc_stats for the built-in host.
func (b *builtinHost) stats(h uint64) (statsABI, error) {
	return rt.stats(h, b.queued())
}

// shutdown fails nothing into the void: pending calls are cancelled (no
// completion will be produced), queued completions are freed, the host's
// connections are closed in the background, and the wake socket closed.
func (b *builtinHost) shutdown() {
	b.mu.Lock()
	gen := b.gen
	b.gen = nil
	q := b.q[b.head:]
	b.q, b.head, b.logs = nil, 0, 0
	b.mu.Unlock()
	for i := range q {
		q[i].free()
	}
	if gen != nil {
		gen.alive.Store(false)
		gen.cancel()
	}
	b.calls.cancelAll()
	if gen != nil {
		for _, c := range rt.remove(0, gen) {
			go rt.closeClient(c)
		}
	}
	b.wake.close()
}

// errString writes msg NUL-terminated into buf (truncated to fit).
func errString(buf unsafe.Pointer, size uintptr, msg string) {
	if buf == nil || size == 0 {
		return
	}
	b := unsafe.Slice((*byte)(buf), size)
	n := copy(b[:size-1], msg)
	b[n] = 0
}
