package bridge

import (
	"sync"
	"testing"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// cancelAll runs while calls are being started on other goroutines (a
// connection closes as its calls start): under -race, an entry read
// outside its shard's lock is a reported race, and every call ends either
// cancelled before it started or handed to cancel after.
func TestCancelAllRacesStarted(t *testing.T) {
	c := &conn{r: &Runtime{}}
	const rounds, perRound = 50, 64
	for round := 0; round < rounds; round++ {
		var calls Calls
		entries := make([]*callEntry, perRound)
		for i := range entries {
			entries[i] = &callEntry{}
			if !calls.insert(uint64(i), entries[i]) {
				t.Fatalf("insert %d refused", i)
			}
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i, e := range entries {
				// A zero Pending cancels nothing: only the
				// bookkeeping is under test.
				calls.started(uint64(i), e, qrpc.Pending{}, c)
			}
		}()
		go func() {
			defer wg.Done()
			calls.cancelAll()
		}()
		wg.Wait()
		if n := calls.Len(); n != 0 {
			t.Fatalf("round %d: %d entries left after cancelAll", round, n)
		}
		for i, e := range entries {
			if !e.started {
				t.Fatalf("round %d: entry %d never started", round, i)
			}
		}
	}
}
