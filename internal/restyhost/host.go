// Package restyhost is the lua-resty-ffi host of libffi_qrpc.so
// (libffi_init): a goroutine polls lua-resty-ffi's task queue and runs
// each task's command on the shared runtime.
package restyhost

import (
	"encoding/binary"
	"fmt"
	"math"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/hostq"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
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
// Answers with rc 0: UNARY and ECHO give a result blob (qrpc.h);
// CONNECT gives the handle as 8 bytes (native-endian uint64); EVENT,
// CLOSE and CANCEL give no data. CANCEL does nothing here: the caller's
// coroutine is parked on its own task, and Go's deadline ends every call.
// Errors: rc is the negative status and the data is the message.
type restyHost struct {
	rt      *bridge.Runtime
	tq      unsafe.Pointer
	cfg     string
	gen     *bridge.Gen
	pending sync.WaitGroup // tasks not yet answered
	tasks   atomic.Uint64
}

// restyTask is one task, and the bridge.Host of its command. Answering is
// idempotent, so that the recover paths can always try to answer without
// risking a second ngx_http_lua_ffi_respond.
type restyTask struct {
	h        *restyHost
	task     unsafe.Pointer
	answered atomic.Bool
}

func (t *restyTask) answer(rc int32, data unsafe.Pointer, n int) {
	if n > math.MaxInt32 {
		// lua-resty-ffi takes the length as a C int: a longer answer
		// would arrive cut (or negative). max_frame_size keeps answers
		// far below this; should one get here, it is an error.
		hostq.Mem().Free(data)
		c := t.h.rt.Message(bridge.ErrGeneric, "qrpc: answer too large for lua-resty-ffi (over 2 GiB)", 0)
		rc, data, n = bridge.ErrGeneric, c.Data, int(c.Len)
	}
	if !t.answered.CompareAndSwap(false, true) {
		hostq.Mem().Free(data)
		return
	}
	respond(t.task, rc, data, n)
	t.h.pending.Done()
}

func (t *restyTask) fail(status int32, msg string) {
	c := t.h.rt.Message(status, msg, 0)
	t.answer(status, c.Data, int(c.Len))
}

func (t *restyTask) Gen() (*bridge.Gen, error) { return t.h.gen, nil }

// Calls is nil: CANCEL does nothing here (see restyHost).
func (t *restyTask) Calls() *bridge.Calls { return nil }

// Complete answers the task; a new connection's handle is encoded as 8
// bytes.
func (t *restyTask) Complete(c bridge.Completion) {
	if c.Status == bridge.StatusOK && c.Handle != 0 {
		p := hostq.Mem().Alloc(8)
		if p == nil {
			t.fail(bridge.ErrGeneric, "out of memory")
			return
		}
		binary.NativeEndian.PutUint64(bridge.Bytes(p, 8), c.Handle)
		c.Data, c.Len = p, 8
	}
	t.answer(c.Status, c.Data, int(c.Len))
}

// Init starts a host on runtime rt. cfg is copied by the caller.
func Init(rt *bridge.Runtime, cfg string, tq unsafe.Pointer) error {
	_, err := start(rt, cfg, tq)
	return err
}

func start(rt *bridge.Runtime, cfg string, tq unsafe.Pointer) (*restyHost, error) {
	if err := hostq.CheckLayout(); err != nil {
		return nil, fmt.Errorf("libffi_qrpc.so does not match qrpc.h: %w", err)
	}
	if tq == nil {
		return nil, fmt.Errorf("NULL task queue")
	}
	if err := resolveRestyFFI(); err != nil {
		return nil, err
	}
	if err := rt.ApplyHostConfig(cfg); err != nil {
		return nil, err
	}
	h := &restyHost{rt: rt, tq: tq, cfg: cfg, gen: bridge.NewGen()}
	safego.Go("lua-resty-ffi poll loop", h.run, nil)
	return h, nil
}

// run polls until lua-resty-ffi unloads the runtime. Should the loop
// panic it polls on (no task would ever be answered again otherwise),
// after answering the task it had taken with "internal error".
func (h *restyHost) run() {
	// The poll call blocks its thread in a condition wait: keep it on one
	// thread rather than have the scheduler spread it.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	var held unsafe.Pointer // taken from the queue, not yet handed to handle
	for safego.Run("lua-resty-ffi poll loop", func() { h.poll(&held) }, func() {
		if held != nil {
			h.pending.Add(1)
			(&restyTask{h: h, task: held}).fail(bridge.ErrGeneric, "internal error")
			held = nil
		}
	}) {
	}
	h.stop()
}

// poll takes tasks until the NULL one.
func (h *restyHost) poll(held *unsafe.Pointer) {
	for {
		task := taskPoll(h.tq)
		if task == nil {
			return // the queue is freed: never touch tq again
		}
		h.tasks.Add(1)
		*held = task
		safego.Inject("lua-resty-ffi poll loop")
		*held = nil
		h.handle(task)
	}
}

// handle decodes a task's command and runs it; synchronous results are
// answered here, the others by Complete.
func (h *restyHost) handle(task unsafe.Pointer) {
	rt := h.rt
	t := &restyTask{h: h, task: task}
	h.pending.Add(1)
	defer safego.Recover("lua-resty-ffi task", func() { t.fail(bridge.ErrGeneric, "internal error") })
	req, n := taskReq(task)
	if req == nil || n != hostq.SizeofCmd {
		t.fail(bridge.ErrBadArg, fmt.Sprintf("bad command: request is %d bytes, want sizeof(qrpc_cmd_t) = %d", n, hostq.SizeofCmd))
		return
	}
	var cmd bridge.Command
	if err := bridge.DecodeCmd((*bridge.CmdABI)(req), &cmd); err != nil {
		t.fail(bridge.StatusOf(err))
		return
	}
	switch st, msg := rt.Submit(t, &cmd); st {
	case bridge.StatusPending:
	case bridge.StatusOK:
		t.answer(bridge.StatusOK, nil, 0)
	default:
		t.fail(st, msg)
	}
}

// stop runs after the NULL task: dials are aborted, the host's connections
// closed (their pending calls answer "closed"), then it waits, bounded, for
// the remaining answers.
func (h *restyHost) stop() {
	rt := h.rt
	defer safego.Recover("lua-resty-ffi stop", nil)
	rt.EndGen(h.gen, nil, true) // waiting is fine: we are on our own goroutine
	done := make(chan struct{})
	safego.Go("lua-resty-ffi stop", func() {
		h.pending.Wait()
		close(done)
	}, nil)
	t := time.NewTimer(restyStopWait)
	defer t.Stop()
	select {
	case <-done:
		rt.Logger().Info("qrpc lua-resty-ffi runtime stopped", "tasks", h.tasks.Load())
	case <-t.C:
		rt.Logger().Warn("qrpc lua-resty-ffi runtime stopped with tasks still in flight", "tasks", h.tasks.Load(), "waited", restyStopWait)
	}
}
