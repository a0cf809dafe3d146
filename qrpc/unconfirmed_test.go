package qrpc

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// A stateless reset ends a connection that was never up (the server had
// not confirmed the handshake and answered nothing) as a refused dial;
// once the server confirmed it or answered a call, a reset is a loss.
func TestDroppedUnconfirmed(t *testing.T) {
	reset := fmt.Errorf("read: %w", &quic.StatelessResetError{})
	now := time.Now()
	c := &Client{cfg: Config{DialTimeout: 5 * time.Second}}
	clock := func() time.Time { return now }
	c.nowFn.Store(&clock)
	open := func() *qconn { return &qconn{c: c, confirmed: make(chan struct{}), upAt: now} }

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
	if s := (&qconn{c: c, confirmed: ch, upAt: now}); s.droppedUnconfirmed(reset) {
		t.Error("a reset after the server confirmed the handshake counted as a refusal")
	}
	// A server that confirms nothing, a connection that carried only
	// events (no answers): up for longer than a dial may take, it was
	// accepted, and its reset is a loss (a restarted server).
	old := open()
	old.upAt = now.Add(-6 * time.Second)
	if old.droppedUnconfirmed(reset) {
		t.Error("a reset of a connection up for longer than a dial counted as a refusal")
	}
}
