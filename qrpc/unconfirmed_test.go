package qrpc

import (
	"errors"
	"fmt"
	"testing"

	"github.com/quic-go/quic-go"
)

// A stateless reset ends a connection that was never up (the server had
// not confirmed the handshake and answered nothing) as a refused dial;
// once the server confirmed it or answered a call, a reset is a loss.
func TestDroppedUnconfirmed(t *testing.T) {
	reset := fmt.Errorf("read: %w", &quic.StatelessResetError{})
	open := func() *qconn { return &qconn{confirmed: make(chan struct{})} }

	if s := open(); !s.droppedUnconfirmed(reset) {
		t.Error("a reset before confirmation and before any answer is not a refusal")
	}
	if s := open(); s.droppedUnconfirmed(errors.New("other")) {
		t.Error("an error that is not a stateless reset counted as one")
	}
	s := open()
	s.maxAnswered.Store(7)
	if s.droppedUnconfirmed(reset) {
		t.Error("a reset after an answer counted as a refusal")
	}
	ch := make(chan struct{})
	close(ch)
	if s := (&qconn{confirmed: ch}); s.droppedUnconfirmed(reset) {
		t.Error("a reset after the server confirmed the handshake counted as a refusal")
	}
}
