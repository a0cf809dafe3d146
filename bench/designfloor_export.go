package main

// A design without the hand-off to a goroutine: the host thread (a C
// thread, as the nginx thread is) makes each call inside a Go export and
// waits there for its answer. It would block nginx's event loop for the
// whole call, so the module cannot take it; it is measured to show what
// the hand-off becomes when Go's runtime makes it instead. A thread that
// entered Go through an export runs only its own goroutine (the
// callback's goroutine is locked to it), so quic-go's goroutines run on
// another thread of Go's, and the answer wakes the host thread through
// Go's scheduler.

/*
int floor_export_start(long n);
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// The export's call, set before its host thread starts: an export takes
// no Go values from C.
var floorExport struct {
	c     *qrpc.Client
	body  []byte
	n, i  int
	ended chan error
}

//export floorExportCall
func floorExportCall() C.int {
	x := &floorExport
	var err error
	if floorFailAt > 0 && x.i == floorFailAt {
		err = fmt.Errorf("host thread: %w", syscall.EIO)
	} else {
		var resp *qrpc.Response
		resp, err = x.c.Unary(context.Background(), "echo", x.body)
		if err == nil && len(resp.Body) != len(x.body) {
			err = errors.New("short echo")
		}
	}
	x.i++
	if err != nil || x.i == x.n {
		x.ended <- err
	}
	if err != nil {
		return 1
	}
	return 0
}

// exportFloor makes n sequential calls from a C thread, each inside a Go
// export, and returns the time of the loop.
func exportFloor(c *qrpc.Client, n, size int) (time.Duration, error) {
	if n < 1 {
		return 0, nil
	}
	floorExport.c, floorExport.body = c, make([]byte, size)
	floorExport.n, floorExport.i = n, 0
	floorExport.ended = make(chan error, 1)
	start := time.Now()
	if rc := C.floor_export_start(C.long(n)); rc != 0 {
		return 0, fmt.Errorf("pthread_create: %d", int(rc))
	}
	if err := <-floorExport.ended; err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
