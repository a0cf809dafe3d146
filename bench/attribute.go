package main

// The components of the breakdown (breakdown.go): which part of the
// client side a perf sample was taken in, from its stack.

import "strings"

const (
	modPath = "github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/"

	compLuaJITTraces = "LuaJIT: compiled traces"
	compLuaJITVM     = "LuaJIT: interpreter, GC, lua_* API (libluajit)"
	compNginx        = "nginx (event loop, timers)"
	compNgxLua       = "ngx_http_lua (coroutines, cosockets, semaphores)"
	compCQueue       = "the C queues (hostq.c: submit, poll, release)"
	compHostq        = "internal/hostq, Go side (submitter, waker, wake-up socket)"
	compBridge       = "internal/bridge (Submit, unary, outcome)"
	compPool         = "the pool (qrpc.Pool)"
	compQrpc         = "qrpc client (framing, streams, deadlines, UDP socket)"
	compQuic         = "quic-go"
	compCrypto       = "TLS/crypto (packet protection)"
	compGoSched      = "Go runtime: scheduler, netpoll, channels, timers, locks"
	compGoMem        = "Go runtime: allocation and GC"
	compGoNet        = "Go net, internal/poll, syscall wrappers"
	compGoOther      = "Go: other packages"
	compGoClient     = "the Go client's loop (bench; a design floor's C thread too)"
	compLibc         = "libc (malloc, memcpy, system call wrappers)"
	compVDSO         = "vdso (clock_gettime)"
	compUnknown      = "unknown (no symbol)"
	compKernelPrefix = "kernel: "
)

// component is where a sample's CPU time goes: its leaf frame's code,
// and for the kernel the system call it is inside (or what else brought
// it there).
func component(frames []frame, main bool) string {
	if len(frames) == 0 {
		return compUnknown
	}
	leaf := frames[0]
	switch {
	case leaf.dso == "[kernel.kallsyms]":
		return kernelComponent(frames)
	case strings.Contains(leaf.dso, "libluajit"):
		return compLuaJITVM
	case strings.HasSuffix(leaf.dso, "/nginx") || leaf.dso == "nginx":
		return compNginx
	case strings.Contains(leaf.dso, "ngx_http_lua") || strings.Contains(leaf.dso, "ndk_http"):
		return compNgxLua
	case strings.Contains(leaf.dso, "libc.so") || strings.Contains(leaf.dso, "libpthread"):
		return compLibc
	case leaf.dso == "[vdso]":
		return compVDSO
	}
	if goSym(leaf.sym) {
		return goComponent(leaf.sym)
	}
	if strings.HasPrefix(leaf.sym, "floor_") {
		return compGoClient // a design floor's C thread (designfloor.go)
	}
	if strings.Contains(leaf.dso, "libffi_qrpc") {
		return compCQueue // C code of the library: hostq.c
	}
	if main && (leaf.dso == "[unknown]" || strings.HasPrefix(leaf.dso, "[JIT]") || strings.HasPrefix(leaf.dso, "//anon")) {
		// machine code outside every file: LuaJIT's traces (Go code
		// always has a symbol)
		return compLuaJITTraces
	}
	return compUnknown
}

// goSym says whether sym is a Go function's name (package path, a dot).
func goSym(sym string) bool {
	if strings.HasPrefix(sym, "runtime.") || strings.HasPrefix(sym, "main.") {
		return true
	}
	slash := strings.LastIndexByte(sym, '/')
	return strings.IndexByte(sym[slash+1:], '.') > 0 && !strings.HasPrefix(sym, "[")
}

func goComponent(sym string) string {
	switch {
	case strings.HasPrefix(sym, modPath+"internal/hostq."):
		return compHostq
	case strings.HasPrefix(sym, modPath+"internal/bridge."):
		return compBridge
	case strings.HasPrefix(sym, modPath+"qrpc."):
		for _, p := range []string{"(*Pool)", "(*peerSet)", "(*target)", "(*retryBudget)", "(*latencyHist)", "(*attempt", "(*exclude)", "pool", "Pool"} {
			if strings.HasPrefix(strings.TrimPrefix(sym, modPath+"qrpc."), p) {
				return compPool
			}
		}
		return compQrpc
	case strings.HasPrefix(sym, "github.com/quic-go/"):
		if strings.Contains(sym, "/qtls") || strings.Contains(sym, "/handshake.") {
			return compCrypto
		}
		return compQuic
	case strings.HasPrefix(sym, "crypto/"), strings.Contains(sym, "golang.org/x/crypto"):
		return compCrypto
	case strings.HasPrefix(sym, "main."):
		return compGoClient
	case strings.HasPrefix(sym, "runtime.") || strings.HasPrefix(sym, "internal/runtime/") || strings.HasPrefix(sym, "sync."):
		for _, m := range []string{"malloc", "gc", "GC", "mspan", "mcache", "mcentral", "mheap", "scanobject", "greyobject", "markBits",
			"heapBits", "HeapBits", "sweep", "memclr", "newobject", "makeslice", "growslice", "makemap", "wbBuf", "bulkBarrier",
			"typePointers", "findObject", "nextFree", "gcWork", "spanOf", "pageAlloc", "memmove"} {
			if strings.Contains(sym, m) {
				return compGoMem
			}
		}
		return compGoSched
	case strings.HasPrefix(sym, "internal/poll.") || strings.HasPrefix(sym, "net.") || strings.HasPrefix(sym, "syscall.") ||
		strings.HasPrefix(sym, "os.") || strings.HasPrefix(sym, "internal/syscall"):
		return compGoNet
	}
	return compGoOther
}

// kernelComponent names a kernel sample by its system call, or by what
// else the kernel was doing.
func kernelComponent(frames []frame) string {
	for _, f := range frames {
		for _, p := range []string{"__x64_sys_", "__ia32_sys_", "__se_sys_", "__do_sys_"} {
			if strings.HasPrefix(f.sym, p) {
				return compKernelPrefix + strings.TrimPrefix(f.sym, p)
			}
		}
	}
	for _, f := range frames {
		switch {
		case strings.Contains(f.sym, "page_fault"):
			return compKernelPrefix + "page faults"
		case strings.HasPrefix(f.sym, "irqentry_exit") || strings.HasPrefix(f.sym, "exit_to_user_mode"):
			return compKernelPrefix + "preemption on return to user space"
		}
	}
	for _, f := range frames {
		if strings.Contains(f.sym, "irq") || strings.Contains(f.sym, "interrupt") || strings.Contains(f.sym, "apic_timer") {
			return compKernelPrefix + "interrupts (timer, network)"
		}
	}
	return compKernelPrefix + "other (no system call)"
}
