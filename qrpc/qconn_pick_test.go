package qrpc

import (
	"errors"
	"strings"
	"testing"
)

// TestSessionDeadSaysWhy: between a connection's death and its slot
// recording why (the slot's goroutine runs a moment later), a call reads
// the cause from the dead session itself. Before, it read "unavailable:
// reconnecting", which says nothing, and a test of a killed server took it
// for the wrong scenario (a bare-Debian make test).
func TestSessionDeadSaysWhy(t *testing.T) {
	cause := errors.New("read udp: connection refused")
	dead := &session{err: cause}
	dead.dead.Store(true)
	sl := &slot{}
	sl.cur.Store(dead)
	older := errors.New("an older dial failure")
	sl.lastErr.Store(&older)
	c := &Client{slots: []*slot{sl}}

	_, err := c.session()
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("dead session: %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), cause.Error()) {
		t.Fatalf("dead session: %q, want the session's own cause %q (not the slot's older record)", err, cause)
	}
	if r := Classify(err).Reason; r != ReasonRefused {
		t.Fatalf("dead session: reason %q, want %q", r, ReasonRefused)
	}

	// Once the slot has moved on (no session in place), its record speaks.
	sl.cur.Store(nil)
	if _, err := c.session(); err == nil || !strings.Contains(err.Error(), older.Error()) {
		t.Fatalf("no session: %v, want the slot's record %q", err, older)
	}
	// Nothing recorded at all: the one case left for "reconnecting".
	sl.lastErr.Store(nil)
	if _, err := c.session(); ErrorString(err) != "unavailable: reconnecting" {
		t.Fatalf("nothing recorded: %q, want \"unavailable: reconnecting\"", ErrorString(err))
	}
}
