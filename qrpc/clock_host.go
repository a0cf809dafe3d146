package qrpc

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// hostOffset is CLOCK_MONOTONIC minus monoNS: records shared between the
// processes of the host carry CLOCK_MONOTONIC, which they all read alike
// (Go's own monotonic reading counts from each process's start).
var hostOffset = sync.OnceValue(func() int64 {
	var ts unix.Timespec
	before := monoNS(time.Now())
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano() - before
})
