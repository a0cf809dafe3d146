// Command ffi is libffi_qrpc.so, the qrpc runtime that nginx workers load
// into their process. Build it with
//
//	go build -buildmode=c-shared -o libffi_qrpc.so ./ffi
//
// internal/hostq/qrpc.h is the C ABI. The library serves two hosts with one runtime (one
// per process, i.e. per nginx worker): the built-in host (qrpc_init,
// qrpc_submit_async, qrpc_vm_poll, ... driven by the Lua module
// (lua/resty/ffi/qrpc/) on stock ngx_lua) and lua-resty-ffi (libffi_init).
//
// It never imports os/signal, so Go installs handlers only for the
// synchronous signals, SIGPIPE (which it forwards to nginx's SIG_IGN when
// raised outside Go code) and its preemption signal. It does wrap nginx's
// handlers of the asynchronous signals so that they run on the nginx
// thread, as before Go's threads existed: see the forwarders in internal/hostq/sigfwd.go
// (QRPC_NO_SIGNAL_FORWARD=1 disables them).
package main

func main() {}
