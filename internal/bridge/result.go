package bridge

import "unsafe"

// Result builds a result blob in the runtime's Memory: this is the one
// copy of a response from Go memory to C memory.
func (r *Runtime) Result(code uint32, hdrs [][]byte, body []byte) Completion {
	n := ResultSize(hdrs, body)
	p := r.mem.Alloc(n)
	if p == nil {
		return r.Message(ErrGeneric, "out of memory", 0)
	}
	WriteResult(Bytes(p, n), code, hdrs, body)
	return Completion{Status: StatusOK, Data: p, Len: uintptr(n)}
}

// Message is a completion whose data is msg, NUL-terminated (Len excludes
// the NUL), for errors and log lines. Data is nil if memory is exhausted.
func (r *Runtime) Message(status int32, msg string, callID uint64) Completion {
	c := Completion{CallID: callID, Status: status}
	p := r.mem.Alloc(len(msg) + 1)
	if p == nil {
		return c
	}
	b := Bytes(p, len(msg)+1)
	copy(b, msg)
	b[len(msg)] = 0
	c.Data, c.Len = p, uintptr(len(msg))
	return c
}

func (r *Runtime) errCompletion(err error) Completion {
	st, msg := StatusOf(err)
	return r.Message(st, msg, 0)
}

// Free releases c's data (nil is fine) and clears it.
func (r *Runtime) Free(c *Completion) {
	r.mem.Free(c.Data)
	c.Data, c.Len = nil, 0
}

// Bytes views n bytes at p.
func Bytes(p unsafe.Pointer, n int) []byte { return unsafe.Slice((*byte)(p), n) }
