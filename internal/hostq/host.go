// Package hostq is the built-in host of libffi_qrpc.so (the one for stock
// nginx + ngx_lua): its queues in C (hostq.c: the submit queue, the
// completion queue, the caches of blocks), their Go side (the submitter,
// the waker, the trimmer), the wake-up socket, C memory for the runtime,
// the signal forwarders, and the C ABI (qrpc.h, which make install ships)
// with the check of its layout. ffi/ exports it.
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
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/metrics"
)

// maxQueuedLogs bounds the log lines waiting in the completion queue: with
// a dead dispatcher, logs must not grow without limit. Beyond it lines are
// dropped and counted.
const maxQueuedLogs = 1000

// Host is the host for stock nginx + ngx_lua: Lua submits through the C
// submit queue (qrpc_submit_async, queue.go), completions wait in a
// queue in C that qrpc_vm_poll empties, and the first completion after the
// queue was empty writes one byte to the dispatcher's unix socket. It is
// the runtime's bridge.Host for every command of both, and for the EVENT
// and CLOSE that qrpc_query runs at once (RunNow).
//
// A process runs one Lua VM per nginx subsystem that uses the library
// (ngx_http_lua's, ngx_stream_lua's), each with its own dispatcher: each
// VM has a completion queue, a wake-up socket and a call table of its own
// (VM, qrpc_vm_open), and every command names its VM (qrpc_cmd_t.vm), so
// that a VM never drains another's completions. The embedded VM is VM 0.
type Host struct {
	mu sync.Mutex // orders init and shutdown, and VM registration
	// nil when not initialised (or shut down); atomic, because every
	// command reads it (Gen) and a mutex there was 1-2 % of the nginx
	// thread's time on an echo answered inside a Go export
	gen atomic.Pointer[bridge.Gen]

	logDrops       atomic.Uint64
	lastDropReport atomic.Int64 // unix nanoseconds
	*VM
	vms      [MaxVMs]VM
	wakeMask atomic.Uint64 // VMs whose wake byte the waker owes (bit i: VM i)
	submitq  submitter
}

// MaxVMs is QRPC_MAX_VMS: the Lua VMs one process serves.
const MaxVMs = bridge.MaxVMs

// VM is one Lua VM's side of the built-in host: its completion queue (in
// C), its wake-up socket and its call table (CANCEL finds only its own
// VM's calls: call ids are chosen by each VM). It is a bridge.Host: the
// outcome of a command goes to the queue of the VM that submitted it.
type VM struct {
	b     *Host
	idx   int
	name  string                 // under b.mu; "" while unregistered
	token uint64                 // under b.mu: the Lua VM that registered name (VMOpen)
	label atomic.Pointer[string] // name, for the metrics
	// completions pushed to its queue, log lines not counted
	completed atomic.Uint64
	calls     bridge.Calls
	wake      wakeState
}

var builtin = &Host{}

func init() {
	for i := range builtin.vms {
		builtin.vms[i].b, builtin.vms[i].idx = builtin, i
	}
	builtin.VM = &builtin.vms[0]
}

// rt is the one runtime of the process (= nginx worker), shared by both
// hosts. Its log lines go through the built-in host's queue when it is
// open.
// (Set in init: the sink refers back to rt.)
var rt *bridge.Runtime

func init() {
	rt = bridge.New(cmem, func(level uint32, line string) bool { return builtin.pushLog(level, line) })
	rt.Metrics().SetExtraCounters(builtin.vmCounters)
}

// vmCounters reports each registered VM's completions (metrics).
func (b *Host) vmCounters(add func(series string, v float64)) {
	for i := range b.vms {
		v := &b.vms[i]
		if name := v.label.Load(); name != nil {
			add(metrics.NameVMCompletions+`{subsystem="`+*name+`"}`, float64(v.completed.Load()))
		}
	}
}

// Builtin is the process's built-in host.
func Builtin() *Host { return builtin }

// Runtime is the process's runtime.
func Runtime() *bridge.Runtime { return rt }

// goEntries counts the calls that entered Go through the exports: the
// built-in host's hot path (qrpc_submit_async, qrpc_vm_poll, qrpc_release in
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

// Gen is the host's current lifetime (bridge.Host, with VM 0's Calls,
// Queued and Complete).
func (b *Host) Gen() (*bridge.Gen, error) {
	g := b.gen.Load()
	if g == nil {
		return nil, errNotInit
	}
	return g, nil
}

// VMOpen registers a Lua VM by name (qrpc_vm_open) and returns its index:
// the index it already has, else VM 0 when no VM has registered yet, else
// the next free one. token tells Lua VMs apart: the name's first token
// keeps it, another token is refused (0 skips the check). Two Lua VMs
// under one name would share a completion queue and call ids counted
// from 1 in each: with lua_code_cache off (a VM per request) the newer
// one's wake-up socket replaced the older's, calls timed out, and the
// older dispatcher reopened its socket in a loop.
func (b *Host) VMOpen(name string, token uint64) (int, error) {
	if !vmName(name) {
		return -1, fmt.Errorf("%w: a VM name is 1..64 bytes of a-z, 0-9 and _ (got %q)", bridge.ErrBadCommand, bridge.Clip(name))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	free := -1
	for i := range b.vms {
		switch b.vms[i].name {
		case name:
			if v := &b.vms[i]; token != 0 && v.token != 0 && token != v.token {
				return -1, fmt.Errorf("another Lua VM of this process registered as %q first: one Lua VM per subsystem (lua_code_cache off, which gives each request its own, is not supported)", name)
			} else if v.token == 0 {
				v.token = token
			}
			return i, nil
		case "":
			if free < 0 {
				free = i
			}
		}
	}
	if free < 0 {
		return -1, fmt.Errorf("%w: %d Lua VMs are registered already, the most one process serves", bridge.ErrBadCommand, MaxVMs)
	}
	b.vms[free].name = name
	b.vms[free].token = token
	b.vms[free].label.Store(&name)
	vmMarkOpen(free)
	return free, nil
}

// vmName: a VM's name is a metrics label value too.
func vmName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// VMAt is VM i, or nil when i is out of range.
func (b *Host) VMAt(i int) *VM {
	if i < 0 || i >= MaxVMs {
		return nil
	}
	return &b.vms[i]
}

// QueuedAll is how many completions wait in all VMs' queues.
func (b *Host) QueuedAll() int { return cqLen(-1) }

// Gen, Calls and Complete make a VM a bridge.Host.
func (v *VM) Gen() (*bridge.Gen, error) { return v.b.Gen() }

func (v *VM) Calls() *bridge.Calls { return &v.calls }

// Queued is how many completions wait in v's queue.
func (v *VM) Queued() int { return cqLen(v.idx) }

// Complete queues a completion (the host is closed: frees it).
func (v *VM) Complete(c bridge.Completion) {
	if !v.enqueue(c) {
		rt.Free(&c)
	}
}

// enqueue appends c and wakes the dispatcher when the queue was empty;
// false when the host is closed. Called from qrpc's goroutines and from
// the nginx thread.
func (v *VM) enqueue(c bridge.Completion) bool {
	switch v.push(&c) {
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
func (v *VM) push(c *bridge.Completion) int {
	rc := cqPush(v.idx, c, maxQueuedLogs)
	if rc >= 0 && c.Status != bridge.StatusLog && c.Status != bridge.StatusShare {
		v.completed.Add(1)
	}
	if rc == 1 {
		v.wakeSoon()
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
func (v *VM) wakeSoon() {
	b := v.b
	if inExport.Load() == 0 {
		if k := b.submitq.kick.Load(); k != nil {
			b.wakeMask.Or(1 << v.idx)
			select {
			case *k <- struct{}{}:
			default: // a kick is pending: its byte comes after this push
			}
			return
		}
	}
	v.wake.signal()
}

// NotifyShare asks the VM's dispatcher for a step of the shared pool of
// connection handle (QRPC_SHARE). The pool asks again only after the
// step, so at most one is queued per pool.
func (v *VM) NotifyShare(handle uint64) bool {
	c := bridge.Completion{Status: bridge.StatusShare, Handle: handle}
	return v.push(&c) == 0
}

// signalVMs writes a wake byte to each VM of mask (bit i: VM i).
func (b *Host) signalVMs(mask uint64) {
	for i := 0; mask != 0 && i < MaxVMs; i++ {
		if mask&(1<<i) != 0 {
			mask &^= 1 << i
			b.vms[i].wake.signal()
		}
	}
}

// logVM is the VM that gets Go's log lines: the first whose dispatcher is
// connected, else VM 0.
func (b *Host) logVM() *VM {
	for i := range b.vms {
		if b.vms[i].wake.conn.Load() != nil {
			return &b.vms[i]
		}
	}
	return &b.vms[0]
}

// pushLog queues a log line (the runtime's LogSink); false when the host
// is not open (the line then goes to stderr).
func (b *Host) pushLog(level uint32, line string) bool {
	open := b.gen.Load() != nil
	if !open {
		return false
	}
	v := b.logVM()
	if cqLogs(v.idx) >= maxQueuedLogs {
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
	switch v.push(&c) {
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

// Drain moves up to len(out) of the VM's completions into out.
func (v *VM) Drain(out []bridge.Completion) int { return cqPoll(v.idx, out) }

// Shutdown fails nothing into the void: pending calls are cancelled (no
// completion will be produced), queued completions are freed, the host's
// connections are closed in the background, and the wake sockets closed.
func (b *Host) Shutdown() {
	// First, while the host is open: queued calls start (or are refused)
	// before the generation ends, which then cancels them like the others.
	// Closes the completion queues too.
	b.submitq.halt()
	b.mu.Lock()
	gen := b.gen.Swap(nil)
	b.mu.Unlock()
	var q [64]bridge.Completion
	for i := range b.vms {
		v := &b.vms[i]
		for n := v.Drain(q[:]); n > 0; n = v.Drain(q[:]) {
			for i := range q[:n] {
				rt.Free(&q[i])
			}
		}
		if gen != nil {
			rt.EndGen(gen, &v.calls, false)
		}
		v.wake.close()
	}
}

// WakeOpen creates a new wake-up socket for the VM in dir
// (qrpc_vm_wake_open): room is the caller's buffer for its path, NUL
// included. Completions queued before the dispatcher connects are
// announced once it has.
func (v *VM) WakeOpen(dir string, room int) (string, error) {
	return v.wake.open(dir, room, func() {
		if v.Queued() > 0 {
			v.wake.signal()
		}
	})
}

// RunNow runs a command at once on the calling thread (qrpc_query): EVENT
// and CLOSE, whose outcome their caller needs before it goes on, and the
// query ops. On success the completion's Data, if any, is the caller's;
// otherwise its Status is an error and msg says why.
func (b *Host) RunNow(c *bridge.Command) (bridge.Completion, string) {
	if c.Op == bridge.OpEvent || c.Op == bridge.OpClose {
		st, msg := rt.Submit(b.VMAt(int(c.VM)), c)
		return bridge.Completion{Status: st}, msg
	}
	return rt.Query(c)
}
