package hostq

// C's malloc and free for the runtime, so that Lua (or lua-resty-ffi) may
// free what it receives with free().

/*
#include <malloc.h>
#include <stdlib.h>

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
*/
import "C"

import (
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bufcache"
)

// cMemory is C's malloc. The runtime allocates through cmem, which keeps
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

// cmem is the runtime's Memory; qrpc_release hands big blocks back to it.
var cmem = bufcache.New(cMemory{}, bufcache.DefaultBudget, bufcache.DefaultTrimInterval)

// Mem is the process's C memory (cmem): the exports free and trim it.
func Mem() *bufcache.Cache { return cmem }
