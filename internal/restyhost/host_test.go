package restyhost

import (
	"math"
	"strconv"
	"testing"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/hostq"
)

// TestAnswerOver2GiB: lua-resty-ffi takes an answer's length as a C int,
// so an answer of 2 GiB or more becomes an error message instead of
// reaching it cut; one of exactly math.MaxInt32 bytes still goes through.
// The answers are lengths only (nil data): lua-resty-ffi's respond is
// replaced and never reads them.
func TestAnswerOver2GiB(t *testing.T) {
	if strconv.IntSize < 64 {
		t.Skip("an int cannot hold a length over 2 GiB here")
	}
	type answer struct {
		rc  int32
		n   int
		msg string
	}
	var got []answer
	saved := respond
	t.Cleanup(func() { respond = saved })
	respond = func(_ unsafe.Pointer, rc int32, data unsafe.Pointer, n int) {
		a := answer{rc: rc, n: n}
		if data != nil && n < 1<<10 {
			a.msg = string(bridge.Bytes(data, n))
		}
		got = append(got, a)
		hostq.Mem().Free(data)
	}
	h := &restyHost{rt: bridge.New(hostq.Mem(), func(uint32, string) bool { return true })}

	over := math.MaxInt32
	over++
	for _, n := range []int{math.MaxInt32, over} {
		h.pending.Add(1)
		(&restyTask{h: h}).answer(bridge.StatusOK, nil, n)
	}

	const msg = "qrpc: answer too large for lua-resty-ffi (over 2 GiB)"
	want := []answer{
		{rc: bridge.StatusOK, n: math.MaxInt32},
		{rc: bridge.ErrGeneric, n: len(msg), msg: msg},
	}
	if len(got) != len(want) {
		t.Fatalf("%d answers %+v, want %+v", len(got), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("answer of %d bytes: got %+v, want %+v", []int{math.MaxInt32, over}[i], got[i], want[i])
		}
	}
}
