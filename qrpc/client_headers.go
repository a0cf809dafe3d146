package qrpc

// evenHeaders drops a dangling name at the end of a flat header list:
// the reference server pairs entries two by two and a name without a
// value carries nothing, so the answer goes through without it (and a
// caller never sees a list it cannot pair).
func evenHeaders(h [][]byte) [][]byte {
	if len(h)%2 == 1 {
		return h[:len(h)-1]
	}
	return h
}
