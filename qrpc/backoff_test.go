package qrpc

import (
	"errors"
	"math"
	"testing"
	"time"
)

// TestBackoff checks the gRPC connection-backoff schedule: base × 1.6^n,
// capped, then ±20 % jitter.
func TestBackoff(t *testing.T) {
	const base, maxDelay = time.Second, 120 * time.Second
	for n := 0; n <= 40; n++ {
		want := math.Min(float64(base)*math.Pow(1.6, float64(n)), float64(maxDelay))
		lo, hi := math.Inf(1), math.Inf(-1)
		for range 2000 {
			d := float64(backoff(base, maxDelay, n))
			lo, hi = math.Min(lo, d), math.Max(hi, d)
		}
		if lo < 0.8*want || hi > 1.2*want {
			t.Fatalf("n=%d: delays in [%v, %v], want within ±20%% of %v", n, time.Duration(lo), time.Duration(hi), time.Duration(want))
		}
		// Jitter is really there, over most of its range.
		if lo > 0.85*want || hi < 1.15*want {
			t.Fatalf("n=%d: delays in [%v, %v] around %v: too little jitter", n, time.Duration(lo), time.Duration(hi), time.Duration(want))
		}
	}
	// The first steps, and the step where the cap takes over (1.6^11 > 120).
	for n, want := range map[int]time.Duration{0: time.Second, 1: 1600 * time.Millisecond, 2: 2560 * time.Millisecond, 10: 109951162777, 11: maxDelay} {
		sum := time.Duration(0)
		for range 4000 {
			sum += backoff(base, maxDelay, n)
		}
		if mean := sum / 4000; mean < want*97/100 || mean > want*103/100 {
			t.Fatalf("n=%d: mean delay %v, want about %v", n, mean, want)
		}
	}
	// A huge retry count neither overflows nor loops for long.
	if d := backoff(base, maxDelay, math.MaxInt32); d < 96*time.Second || d > 144*time.Second {
		t.Fatalf("n=MaxInt32: %v", d)
	}
}

func TestConfigValidation(t *testing.T) {
	bad := []Config{
		{Conns: 65}, {Conns: -1}, {Streams: 1025}, {Streams: -3},
		{DialTimeout: -time.Second}, {IdleTimeout: -1},
		{MaxFrameSize: 63}, {MaxFrameSize: 1<<30 + 1},
		{CertPEM: []byte("x")}, {KeyPEM: []byte("x")},
		{ReceiveWindow: 1000},
		{Pins: [][]byte{make([]byte, 31)}},
	}
	for _, c := range bad {
		if _, err := c.populate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: %v, want ErrBadConfig", c, err)
		}
	}
	var nilCfg *Config
	got, err := nilCfg.populate()
	if err != nil {
		t.Fatal(err)
	}
	if got.Conns != 1 || got.Streams != 32 || got.DialTimeout != 5*time.Second || got.IdleTimeout != 30*time.Second ||
		got.MaxFrameSize != 16<<20 || got.BackoffBase != time.Second || got.BackoffMax != 120*time.Second {
		t.Fatalf("defaults: %+v", got)
	}
	q := got.quicConfig()
	if q.KeepAlivePeriod >= q.MaxIdleTimeout || q.KeepAlivePeriod == 0 {
		t.Fatalf("keep-alive %v must be set below the idle timeout %v", q.KeepAlivePeriod, q.MaxIdleTimeout)
	}
	if q.MaxIncomingStreams >= 0 || q.MaxIncomingUniStreams >= 0 {
		t.Fatal("a qrpc client accepts no peer-opened streams")
	}
	if q.MaxConnectionReceiveWindow > 16<<20 || q.MaxStreamReceiveWindow > 4<<20 {
		t.Fatalf("receive windows not bounded: %d/%d", q.MaxStreamReceiveWindow, q.MaxConnectionReceiveWindow)
	}
	tc, err := got.tlsConfig("example.com:443")
	if err != nil {
		t.Fatal(err)
	}
	if tc.ServerName != "example.com" || tc.InsecureSkipVerify || len(tc.NextProtos) != 1 || tc.NextProtos[0] != ALPN || tc.MinVersion != 0x0304 {
		t.Fatalf("tls defaults: name %q insecure %v alpn %v min %x", tc.ServerName, tc.InsecureSkipVerify, tc.NextProtos, tc.MinVersion)
	}
	if _, err := (&Config{CAPEM: []byte("not pem")}).tlsConfig("a:1"); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("bad CA PEM: %v", err)
	}
}
