package restyhost

// lua-resty-ffi's functions, found with dlsym when a host starts.

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

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

static char *qrpc_get_req(void *task, int *len) { return qrpc_p_get_req(task, len); }
static void qrpc_respond(void *task, int rc, char *rsp, int len) { qrpc_p_respond(task, rc, rsp, len); }
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

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

// respond hands a task its answer (taskRespond: lua-resty-ffi's respond).
// A variable, so that the answer-size check can be tested without a 2 GiB
// answer.
var respond = taskRespond

func taskRespond(task unsafe.Pointer, rc int32, data unsafe.Pointer, n int) {
	C.qrpc_respond(task, C.int(rc), (*C.char)(data), C.int(n))
}
