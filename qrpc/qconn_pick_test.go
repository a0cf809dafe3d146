package qrpc

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
)

// TestSessionDeadSaysWhy: between a connection's death and its slot
// recording why (the slot's goroutine runs a moment later), a call reads
// the cause from the dead qconn itself, not "unavailable: reconnecting",
// which says nothing (and which a test of a killed server would take for
// another scenario).
func TestSessionDeadSaysWhy(t *testing.T) {
	cause := errors.New("read udp: connection refused")
	dead := &qconn{err: cause}
	dead.dead.Store(true)
	sl := &slot{}
	sl.cur.Store(dead)
	older := errors.New("an older dial failure")
	sl.lastErr.Store(&older)
	c := &Client{slots: []*slot{sl}}

	_, err := c.qconn()
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("dead qconn: %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), cause.Error()) {
		t.Fatalf("dead qconn: %q, want the qconn's own cause %q (not the slot's older record)", err, cause)
	}
	if r := Classify(err).Reason; r != ReasonRefused {
		t.Fatalf("dead qconn: reason %q, want %q", r, ReasonRefused)
	}

	// Once the slot has moved on (no qconn in place), its record speaks.
	sl.cur.Store(nil)
	if _, err := c.qconn(); err == nil || !strings.Contains(err.Error(), older.Error()) {
		t.Fatalf("no qconn: %v, want the slot's record %q", err, older)
	}
	// Nothing recorded at all: the one case left for "reconnecting".
	sl.lastErr.Store(nil)
	if _, err := c.qconn(); ErrorString(err) != "unavailable: reconnecting" {
		t.Fatalf("nothing recorded: %q, want \"unavailable: reconnecting\"", ErrorString(err))
	}
}

// TestRefusalNotSent: a call that meets a connection the server refused
// was certainly not sent, whether Client.qconn finds the refusal or
// qconn.start does (the connection failed after it was picked): its
// error is one a pool takes as "never sent" and moves on to another
// server with, and it still says why.
func TestRefusalNotSent(t *testing.T) {
	refusal := &DialError{Addr: "127.0.0.1:1", Reason: ReasonClientCertNeeded}
	dead := &qconn{err: refusal, refusal: refusal}
	dead.dead.Store(true)
	sl := &slot{}
	sl.cur.Store(dead)
	c := &Client{slots: []*slot{sl}}
	_, err := c.qconn()
	if !neverSent(err) || Classify(err).Reason != ReasonClientCertNeeded {
		t.Errorf("refused connection in place: %v (never sent: %v), want a never-sent error with the refusal's reason", err, neverSent(err))
	}

	conf, err := (&Config{}).populate()
	if err != nil {
		t.Fatal(err)
	}
	c = newClient("127.0.0.1:1", conf, nil, nil, nil)
	picked := &qconn{c: c, refusal: refusal}
	picked.pending.init()
	picked.pending.closeAll(func(*pendingCall) {})
	picked.streams = make([]atomic.Pointer[cstream], 1)
	picked.streams[0].Store(newCstream(picked, nil, 0))
	_, err = picked.start(&Call{Method: []byte("echo")}, func(*Response, error) {})
	if !neverSent(err) || Classify(err).Reason != ReasonClientCertNeeded {
		t.Errorf("connection refused after it was picked: %v (never sent: %v), want a never-sent error with the refusal's reason", err, neverSent(err))
	}
}
