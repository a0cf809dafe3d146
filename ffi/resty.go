package main

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// restyStopWait bounds how long a lua-resty-ffi host, told to stop, waits
// for its tasks still in flight on connections it does not own (its own
// are closed first, which answers theirs at once). Tasks that outlive it
// are still answered, just after the poll goroutine has returned.
const restyStopWait = 10 * time.Second

// restyHost serves one libffi_init: a goroutine polls lua-resty-ffi's task
// queue, runs each command with the shared runtime and answers each task
// exactly once with ngx_http_lua_ffi_respond.
//
// Answers with rc 0: UNARY, ECHO and STATS give a result blob (qrpc.h);
// CONNECT gives the handle as 8 bytes (native-endian uint64); EVENT,
// CLOSE and CANCEL give no data. CANCEL does nothing here: the caller's
// coroutine is parked on its own task, and Go's deadline ends every call.
// Errors: rc is the negative status and the data is the message.
type restyHost struct {
	tq      unsafe.Pointer
	cfg     string
	gen     *hostGen
	pending sync.WaitGroup // tasks not yet answered
	tasks   atomic.Uint64
}

// restyTask makes answering idempotent, so that the recover paths can
// always try to answer without risking a second ngx_http_lua_ffi_respond.
type restyTask struct {
	h        *restyHost
	task     unsafe.Pointer
	answered atomic.Bool
}

func (t *restyTask) answer(rc int32, data unsafe.Pointer, n int) {
	if !t.answered.CompareAndSwap(false, true) {
		cFree(data)
		return
	}
	taskRespond(t.task, rc, data, n)
	t.h.pending.Done()
}

func (t *restyTask) complete(c completion) { t.answer(c.status, c.data, c.n) }

func (t *restyTask) fail(status int32, msg string) {
	p, n := cMessage(msg)
	t.answer(status, p, n)
}

func (t *restyTask) failErr(err error) { t.fail(statusOf(err)) }

// restyInit starts a host. cfg is copied by the caller.
func restyInit(cfg string, tq unsafe.Pointer) (*restyHost, error) {
	if err := checkLayout(); err != nil {
		return nil, fmt.Errorf("libffi_qrpc.so does not match qrpc.h: %w", err)
	}
	if tq == nil {
		return nil, fmt.Errorf("NULL task queue")
	}
	if err := resolveRestyFFI(); err != nil {
		return nil, err
	}
	if err := applyConfig(cfg); err != nil {
		return nil, err
	}
	h := &restyHost{tq: tq, cfg: cfg, gen: newGen()}
	go h.run()
	return h, nil
}

// applyConfig reads libffi_init's cfg: space- or comma-separated
// key=value pairs. Only log_level (debug|info|warn|error) exists.
func applyConfig(cfg string) error {
	for _, kv := range strings.FieldsFunc(cfg, func(r rune) bool { return r == ' ' || r == ',' }) {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "log_level":
			var l slog.Level
			if err := l.UnmarshalText([]byte(v)); err != nil {
				return fmt.Errorf("cfg: log_level: %w", err)
			}
			minLogLevel.Store(int64(l))
		default:
			return fmt.Errorf("cfg: unknown key %q (known: log_level)", k)
		}
	}
	return nil
}

func (h *restyHost) run() {
	defer recoverLog("lua-resty-ffi poll loop")
	// The poll call blocks its thread in a condition wait: keep it on one
	// thread rather than have the scheduler spread it.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	for {
		task := taskPoll(h.tq)
		if task == nil {
			break // the queue is freed: never touch tq again
		}
		h.tasks.Add(1)
		h.handle(task)
	}
	h.stop()
}

func (h *restyHost) handle(task unsafe.Pointer) {
	t := &restyTask{h: h, task: task}
	h.pending.Add(1)
	defer func() {
		if p := recover(); p != nil {
			rt.logger.Error("qrpc panic while handling a task", "panic", fmt.Sprint(p))
			t.fail(errGeneric, "internal error")
		}
	}()
	req, n := taskReq(task)
	if req == nil || n != sizeofCmd {
		t.fail(errBadArg, fmt.Sprintf("bad command: request is %d bytes, want sizeof(qrpc_cmd_t) = %d", n, sizeofCmd))
		return
	}
	cmd, err := decodeCmd((*cmdABI)(req))
	if err != nil {
		t.failErr(err)
		return
	}
	switch cmd.op {
	case opConnect:
		addr, cfg := connectConfig(&cmd, rt.logger)
		go func() {
			defer func() {
				if p := recover(); p != nil {
					rt.logger.Error("qrpc panic while connecting", "panic", fmt.Sprint(p))
					t.fail(errGeneric, "internal error")
				}
			}()
			c, err := rt.dial(h.gen, addr, cfg)
			if err != nil {
				t.failErr(err)
				return
			}
			p := cMalloc(8)
			if p == nil {
				t.fail(errGeneric, "out of memory")
				return
			}
			binary.NativeEndian.PutUint64(cBuf(p, 8), c.handle)
			t.answer(statusOK, p, 8)
		}()
	case opUnary:
		if _, _, err := rt.startUnary(&cmd, t.complete); err != nil {
			t.failErr(err)
		}
	case opEvent:
		if err := rt.event(&cmd); err != nil {
			t.failErr(err)
		} else {
			t.answer(statusOK, nil, 0)
		}
	case opClose:
		if err := rt.closeConn(cmd.conn); err != nil {
			t.failErr(err)
		} else {
			t.answer(statusOK, nil, 0)
		}
	case opCancel:
		t.answer(statusOK, nil, 0)
	case opEcho:
		t.complete(resultCompletion(0, nil, cmd.body))
	case opStats:
		s, err := rt.stats(cmd.conn, 0)
		if err != nil {
			t.failErr(err)
			return
		}
		t.complete(statsCompletion(s))
	default:
		t.fail(errBadArg, fmt.Sprintf("bad command: unknown op %d", cmd.op))
	}
}

// stop runs after the NULL task: dials are aborted, the host's connections
// closed (their pending calls answer "closed"), then it waits, bounded, for
// the remaining answers.
func (h *restyHost) stop() {
	defer recoverLog("lua-resty-ffi stop")
	h.gen.alive.Store(false)
	h.gen.cancel()
	for _, c := range rt.remove(0, h.gen) {
		rt.closeClient(c) // synchronous: we are on our own goroutine
	}
	done := make(chan struct{})
	go func() {
		h.pending.Wait()
		close(done)
	}()
	t := time.NewTimer(restyStopWait)
	defer t.Stop()
	select {
	case <-done:
		rt.logger.Info("qrpc lua-resty-ffi runtime stopped", "tasks", h.tasks.Load())
	case <-t.C:
		rt.logger.Warn("qrpc lua-resty-ffi runtime stopped with tasks still in flight", "tasks", h.tasks.Load(), "waited", restyStopWait)
	}
}
