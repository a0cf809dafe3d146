package qrpc

import (
	"os"

	"golang.org/x/sys/unix"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// watchExit calls gone once process pid has exited, without a timer: a
// pidfd is readable from the process's exit on, and Go's netpoller
// waits for that with the rest of its descriptors. It returns a stop
// that ends the wait (nil: the process cannot be watched, no pidfd on
// this kernel), or exited when the process is gone already.
func watchExit(pid int, gone func()) (stop func(), exited bool) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err == unix.ESRCH {
		return nil, true
	}
	if err != nil {
		return nil, false
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, false
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, false
	}
	safego.Go("pool share watch", func() {
		// A panic ends the watch: the lease's end takes its place.
		safego.Inject("pool share watch")
		exited := false
		// Read returns once the function reports the exit, or with an
		// error once f is closed (stop).
		_ = rc.Read(func(fd uintptr) bool {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, _ := unix.Poll(pfd, 0)
			exited = n > 0
			return exited
		})
		if exited {
			gone()
		}
	}, nil)
	return func() { _ = f.Close() }, false
}
