package main

// The C side of the library that is not an export: malloc/free for the
// runtime, the qrpc.h layout check, run-time resolution of lua-resty-ffi's
// functions, and the signal forwarders. This file includes qrpc.h;
// exports.go must not (see there).

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "qrpc.h"

// cgo's C.malloc aborts the process when malloc fails; inside nginx we
// would rather report an error.
static void *qrpc_malloc(size_t n) { return malloc(n ? n : 1); }

// Frees p unless its block holds at least min bytes; returns 0 when freed,
// else the block's usable size (the caller keeps it for reuse).
static size_t qrpc_free_below(void *p, size_t min) {
	size_t u = malloc_usable_size(p);
	if (u < min) {
		free(p);
		return 0;
	}
	return u;
}

static size_t qrpc_cmd_offset(int i) {
	static const size_t o[] = {
		offsetof(qrpc_cmd_t, version), offsetof(qrpc_cmd_t, op), offsetof(qrpc_cmd_t, conn),
		offsetof(qrpc_cmd_t, call_id), offsetof(qrpc_cmd_t, timeout_ms), offsetof(qrpc_cmd_t, nhdrs),
		offsetof(qrpc_cmd_t, method), offsetof(qrpc_cmd_t, method_len),
		offsetof(qrpc_cmd_t, body), offsetof(qrpc_cmd_t, body_len),
		offsetof(qrpc_cmd_t, hdrs), offsetof(qrpc_cmd_t, hdrs_len),
		offsetof(qrpc_cmd_t, addr), offsetof(qrpc_cmd_t, addr_len),
		offsetof(qrpc_cmd_t, server_name), offsetof(qrpc_cmd_t, server_name_len),
		offsetof(qrpc_cmd_t, ca), offsetof(qrpc_cmd_t, ca_len),
		offsetof(qrpc_cmd_t, cert), offsetof(qrpc_cmd_t, cert_len),
		offsetof(qrpc_cmd_t, key), offsetof(qrpc_cmd_t, key_len),
		offsetof(qrpc_cmd_t, pins), offsetof(qrpc_cmd_t, pins_len),
		offsetof(qrpc_cmd_t, insecure), offsetof(qrpc_cmd_t, conns), offsetof(qrpc_cmd_t, streams),
		offsetof(qrpc_cmd_t, idle_timeout_ms), offsetof(qrpc_cmd_t, max_frame_size),
		offsetof(qrpc_cmd_t, retries),
		offsetof(qrpc_cmd_t, hash_key), offsetof(qrpc_cmd_t, hash_key_len),
		offsetof(qrpc_cmd_t, req_type), offsetof(qrpc_cmd_t, req_type_len),
		offsetof(qrpc_cmd_t, resp_type), offsetof(qrpc_cmd_t, resp_type_len),
		offsetof(qrpc_cmd_t, flags), offsetof(qrpc_cmd_t, reserved2),
		offsetof(qrpc_cmd_t, opts), offsetof(qrpc_cmd_t, opts_len),
	};
	return i < (int)(sizeof o / sizeof o[0]) ? o[i] : (size_t)-1;
}

// The constants of qrpc.h that the runtime mirrors, in constNames' order.
// Returns 0 past the end.
static int qrpc_const(int i, long long *v) {
	static const long long c[] = {
		QRPC_CMD_VERSION,
		QRPC_OP_CONNECT, QRPC_OP_UNARY, QRPC_OP_EVENT, QRPC_OP_CLOSE, QRPC_OP_CANCEL, QRPC_OP_ECHO, QRPC_OP_STATS,
		QRPC_OP_PEERS, QRPC_OP_METRICS, QRPC_OP_PROTO_LOAD, QRPC_OP_CONFIGURE, QRPC_OP_PROFILE, QRPC_F_DISCARD_UNKNOWN,
		QRPC_OK, QRPC_PENDING, QRPC_LOG, QRPC_ERR, QRPC_ERR_TIMEOUT, QRPC_ERR_CLOSED, QRPC_ERR_FULL,
		QRPC_ERR_BADARG, QRPC_ERR_CONNECT, QRPC_ERR_UNAVAIL, QRPC_ERR_TOOBIG, QRPC_ERR_LOST,
		QRPC_F_PROTO_NAMES, QRPC_BAD_RESPONSE, QRPC_F_LUA_TABLE, QRPC_F_LUA_REQUEST,
	};
	if (i < 0 || i >= (int)(sizeof c / sizeof c[0])) return 0;
	if (v != NULL) *v = c[i];
	return 1;
}

static size_t qrpc_completion_offset(int i) {
	static const size_t o[] = {
		offsetof(qrpc_completion_t, call_id), offsetof(qrpc_completion_t, handle),
		offsetof(qrpc_completion_t, status), offsetof(qrpc_completion_t, code),
		offsetof(qrpc_completion_t, data), offsetof(qrpc_completion_t, len),
	};
	return i < (int)(sizeof o / sizeof o[0]) ? o[i] : (size_t)-1;
}

static size_t qrpc_stats_offset(int i) {
	static const size_t o[] = {
		offsetof(qrpc_stats_t, inflight), offsetof(qrpc_stats_t, calls),
		offsetof(qrpc_stats_t, events), offsetof(qrpc_stats_t, dropped),
		offsetof(qrpc_stats_t, reconnects), offsetof(qrpc_stats_t, queued),
	};
	return i < (int)(sizeof o / sizeof o[0]) ? o[i] : (size_t)-1;
}

// lua-resty-ffi's functions, looked up at run time: linking against them
// would make the library fail to load in an nginx without lua-resty-ffi.
typedef void *(*qrpc_poll_fn)(void *);
typedef char *(*qrpc_get_req_fn)(void *, int *);
typedef void (*qrpc_respond_fn)(void *, int, char *, int);

static qrpc_poll_fn qrpc_p_poll;
static qrpc_get_req_fn qrpc_p_get_req;
static qrpc_respond_fn qrpc_p_respond;

// Returns NULL on success, else the name of the missing symbol.
static const char *qrpc_resolve(void) {
	qrpc_p_poll = (qrpc_poll_fn)dlsym(RTLD_DEFAULT, "ngx_http_lua_ffi_task_poll");
	if (qrpc_p_poll == NULL) return "ngx_http_lua_ffi_task_poll";
	qrpc_p_get_req = (qrpc_get_req_fn)dlsym(RTLD_DEFAULT, "ngx_http_lua_ffi_get_req");
	if (qrpc_p_get_req == NULL) return "ngx_http_lua_ffi_get_req";
	qrpc_p_respond = (qrpc_respond_fn)dlsym(RTLD_DEFAULT, "ngx_http_lua_ffi_respond");
	if (qrpc_p_respond == NULL) return "ngx_http_lua_ffi_respond";
	return NULL;
}

static void *qrpc_task_poll(void *tq) { return qrpc_p_poll(tq); }

// Signal forwarders. Without Go, an nginx worker has one thread, so every
// signal sent to the process runs its handler on the nginx thread, and a
// signal that thread blocks waits there until it is unblocked or read from
// a signalfd. Go's threads do not block SIGCHLD (the runtime unblocks it on
// every thread it starts), nor the other asynchronous signals, so the
// kernel hands such signals to a Go thread, where the host's handler then
// runs. For SIGCHLD that breaks os.execute/io.popen (nginx's handler reaps
// the child on the Go thread, system() gets ECHILD: openresty/openresty#1022)
// and ngx.pipe (ngx_lua blocks SIGCHLD on the nginx thread and reads it
// from a signalfd, which never sees it: golang/go#55066). For SIGALRM,
// SIGQUIT... the handler sets nginx's flag without interrupting its
// epoll_wait. So, for the asynchronous signals that have a handler, we
// install one that re-sends the signal to the nginx thread when it lands
// on any other thread, and calls the host's handler otherwise.
static const int qrpc_fwd_signals[] = {
	SIGCHLD, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH, SIGIO, SIGALRM,
};
static struct sigaction qrpc_prev[NSIG];
static volatile pid_t qrpc_host_tid;

static void qrpc_run_prev(int sig, siginfo_t *si, void *uc) {
	const struct sigaction *p = &qrpc_prev[sig];
	if (p->sa_flags & SA_SIGINFO) {
		if (p->sa_sigaction != NULL) p->sa_sigaction(sig, si, uc);
	} else if (p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN) {
		p->sa_handler(sig);
	}
}

// Async-signal-safe: syscalls and a struct copy only.
static void qrpc_forward(int sig, siginfo_t *si, void *uc) {
	int saved = errno;
	pid_t host = qrpc_host_tid;
	if (host != 0 && (pid_t)syscall(SYS_gettid) != host) {
		// Keep the siginfo (si_pid: nginx logs it). The kernel accepts a
		// forged siginfo from another thread only with a negative si_code.
		siginfo_t info = *si;
		info.si_code = SI_QUEUE;
		if (syscall(SYS_rt_tgsigqueueinfo, getpid(), host, sig, &info) == 0 ||
		    syscall(SYS_tgkill, getpid(), host, sig) == 0) {
			errno = saved;
			return;
		}
		// The nginx thread is gone (cannot happen in nginx): handle it here.
	}
	qrpc_run_prev(sig, si, uc);
	errno = saved;
}

// Installs the forwarders once, recording the calling thread as the host's.
// Returns how many signals are forwarded (0 on later calls).
static int qrpc_install_forwarders(void);

// At dlopen, on the loading thread (the nginx worker's, for LuaJIT's
// ffi.load and lua-resty-ffi alike), so that no child can exit unseen
// between loading and the first init call. Priority 101 runs it before the
// library's default-priority constructors, among them the Go runtime's,
// whose signal set-up rewrites dispositions it finds (adding SA_ONSTACK)
// and must see ours, not race with it.
// QRPC_NO_SIGNAL_FORWARD=1 in the environment turns the forwarders off
// (nginx passes it to workers only with an "env QRPC_NO_SIGNAL_FORWARD;"
// line); the test host uses it to show what they prevent.
static int qrpc_fwd_disabled;

__attribute__((constructor(101))) static void qrpc_ctor(void) {
	const char *e = getenv("QRPC_NO_SIGNAL_FORWARD");
	qrpc_fwd_disabled = e != NULL && e[0] == '1';
	qrpc_install_forwarders();
}

static int qrpc_install_forwarders(void) {
	if (qrpc_host_tid != 0 || qrpc_fwd_disabled) return 0;
	qrpc_host_tid = (pid_t)syscall(SYS_gettid);
	int n = 0;
	for (size_t i = 0; i < sizeof qrpc_fwd_signals / sizeof qrpc_fwd_signals[0]; i++) {
		int sig = qrpc_fwd_signals[i];
		struct sigaction cur;
		if (sigaction(sig, NULL, &cur) != 0) continue;
		if (cur.sa_flags & SA_SIGINFO) {
			if (cur.sa_sigaction == NULL || cur.sa_sigaction == qrpc_forward) continue;
		} else if (cur.sa_handler == SIG_DFL || cur.sa_handler == SIG_IGN) {
			continue; // the kernel applies those to the whole process anyway
		}
		qrpc_prev[sig] = cur;
		struct sigaction sa = cur;
		sa.sa_sigaction = qrpc_forward;
		// SA_ONSTACK: on a Go thread the handler must run on the signal
		// stack Go sets up, not on a small goroutine stack.
		sa.sa_flags = (cur.sa_flags | SA_SIGINFO | SA_ONSTACK) & ~SA_RESETHAND;
		if (sigaction(sig, &sa, NULL) == 0) n++;
	}
	return n;
}
static char *qrpc_get_req(void *task, int *len) { return qrpc_p_get_req(task, len); }
static void qrpc_respond(void *task, int rc, char *rsp, int len) { qrpc_p_respond(task, rc, rsp, len); }
*/
import "C"

import (
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bufcache"
)

// cMemory is C's malloc, so that Lua (or lua-resty-ffi) may free what it
// receives with free(). The runtime allocates through cmem, which keeps
// large freed blocks for reuse (see internal/bufcache).
type cMemory struct{}

func (cMemory) Alloc(n int) unsafe.Pointer {
	if n <= smallMax {
		return smallAlloc(n) // no cgo call while qrpc_release keeps blocks
	}
	return C.qrpc_malloc(C.size_t(n))
}
func (cMemory) Free(p unsafe.Pointer) { C.free(p) }
func (cMemory) FreeBelow(p unsafe.Pointer, min int) int {
	return int(C.qrpc_free_below(p, C.size_t(min)))
}

// cmem is the runtime's Memory and what qrpc_free returns blocks to.
var cmem = bufcache.New(cMemory{}, bufcache.DefaultBudget, bufcache.DefaultTrimInterval)

const constNames = `QRPC_CMD_VERSION
	QRPC_OP_CONNECT QRPC_OP_UNARY QRPC_OP_EVENT QRPC_OP_CLOSE QRPC_OP_CANCEL QRPC_OP_ECHO QRPC_OP_STATS
	QRPC_OP_PEERS QRPC_OP_METRICS QRPC_OP_PROTO_LOAD QRPC_OP_CONFIGURE QRPC_OP_PROFILE QRPC_F_DISCARD_UNKNOWN
	QRPC_OK QRPC_PENDING QRPC_LOG QRPC_ERR QRPC_ERR_TIMEOUT QRPC_ERR_CLOSED QRPC_ERR_FULL
	QRPC_ERR_BADARG QRPC_ERR_CONNECT QRPC_ERR_UNAVAIL QRPC_ERR_TOOBIG QRPC_ERR_LOST
	QRPC_F_PROTO_NAMES QRPC_BAD_RESPONSE QRPC_F_LUA_TABLE QRPC_F_LUA_REQUEST`

// abiLayoutErr compares the Go mirrors in abi.go and the runtime's
// constants with the C compiler's view of qrpc.h.
func abiLayoutErr() error {
	names := strings.Fields(constNames)
	goVals := []int64{bridge.CmdVersion,
		bridge.OpConnect, bridge.OpUnary, bridge.OpEvent, bridge.OpClose, bridge.OpCancel, bridge.OpEcho, bridge.OpStats,
		bridge.OpPeers, bridge.OpMetrics, bridge.OpProtoLoad, bridge.OpConfigure, bridge.OpProfile, bridge.FlagDiscardUnknown,
		int64(bridge.StatusOK), int64(bridge.StatusPending), int64(bridge.StatusLog), int64(bridge.ErrGeneric),
		int64(bridge.ErrTimeout), int64(bridge.ErrClosed), int64(bridge.ErrFull), int64(bridge.ErrBadArg),
		int64(bridge.ErrConnect), int64(bridge.ErrUnavail), int64(bridge.ErrTooBig), int64(bridge.ErrLost),
		bridge.FlagProtoNames, bridge.StatusBadResponse, bridge.FlagLuaTable, bridge.FlagLuaRequest}
	if len(names) != len(goVals) || C.qrpc_const(C.int(len(goVals)), nil) != 0 {
		return fmt.Errorf("the constant lists of cgo.go differ in length")
	}
	for i, g := range goVals {
		var v C.longlong
		if C.qrpc_const(C.int(i), &v) == 0 || int64(v) != g {
			return fmt.Errorf("%s is %d in C, %d in Go", names[i], v, g)
		}
	}
	check := func(name string, goSize, cSize uintptr, goOff []uintptr, cOff func(int) uintptr) error {
		if goSize != cSize {
			return fmt.Errorf("%s: size %d in Go, %d in C", name, goSize, cSize)
		}
		for i, o := range goOff {
			if c := cOff(i); c != o {
				return fmt.Errorf("%s: field %d at offset %d in Go, %d in C", name, i, o, c)
			}
		}
		if cOff(len(goOff)) != ^uintptr(0) {
			return fmt.Errorf("%s: C has more fields than Go", name)
		}
		return nil
	}
	if err := check("qrpc_cmd_t", unsafe.Sizeof(cmdABI{}), C.sizeof_qrpc_cmd_t, cmdOffsets(),
		func(i int) uintptr { return uintptr(C.qrpc_cmd_offset(C.int(i))) }); err != nil {
		return err
	}
	if err := check("qrpc_completion_t", unsafe.Sizeof(completionABI{}), C.sizeof_qrpc_completion_t, completionOffsets(),
		func(i int) uintptr { return uintptr(C.qrpc_completion_offset(C.int(i))) }); err != nil {
		return err
	}
	return check("qrpc_stats_t", unsafe.Sizeof(statsABI{}), C.sizeof_qrpc_stats_t, statsOffsets(),
		func(i int) uintptr { return uintptr(C.qrpc_stats_offset(C.int(i))) })
}

var (
	layoutOnce sync.Once
	layoutErr  error
)

// checkLayout runs abiLayoutErr once; every export refuses to work when it
// failed.
func checkLayout() error {
	layoutOnce.Do(func() { layoutErr = abiLayoutErr() })
	return layoutErr
}

var (
	resolveMu  sync.Mutex
	resolveErr error
	resolved   bool
)

// resolveRestyFFI looks up lua-resty-ffi's functions in the process.
func resolveRestyFFI() error {
	resolveMu.Lock()
	defer resolveMu.Unlock()
	if resolved {
		return resolveErr
	}
	if missing := C.qrpc_resolve(); missing != nil {
		// Not cached: lua-resty-ffi may be loaded later.
		return fmt.Errorf("lua-resty-ffi not found in this process (no symbol %s)", C.GoString(missing))
	}
	resolved = true
	return nil
}

func taskPoll(tq unsafe.Pointer) unsafe.Pointer { return C.qrpc_task_poll(tq) }

func taskReq(task unsafe.Pointer) (unsafe.Pointer, int) {
	var n C.int
	p := C.qrpc_get_req(task, &n)
	return unsafe.Pointer(p), int(n)
}

func taskRespond(task unsafe.Pointer, rc int32, data unsafe.Pointer, n int) {
	C.qrpc_respond(task, C.int(rc), (*C.char)(data), C.int(n))
}

// installSignalForwarders routes asynchronous signals to the calling
// thread (see the C comment above). Only the exports call it, on the nginx
// thread: in a Go program (tests) the handlers are Go's own.
func installSignalForwarders() int { return int(C.qrpc_install_forwarders()) }

// sizeofCmd is sizeof(qrpc_cmd_t), the exact length of a lua-resty-ffi request.
const sizeofCmd = C.sizeof_qrpc_cmd_t
