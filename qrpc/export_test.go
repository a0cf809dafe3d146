package qrpc

import "time"

// SetClockForTest makes the client's deadline check of responses read now
// instead of time.Now; the returned function restores it.
func SetClockForTest(now func() time.Time) (restore func()) {
	clock.Store(&now)
	return func() { clock.Store(nil) }
}
