package qrpc

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/limits"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc/internal/frame"
)

// ALPN is the only application protocol qrpc speaks.
const ALPN = "qrpc"

// Config configures a Client. The zero value works: it verifies the server
// against the system roots with the host part of the address as name.
type Config struct {
	// ServerName is the SNI and the name the certificate must carry.
	// Default: the host part of the address.
	ServerName string
	// CAPEM, when set, replaces the system roots with these certificates.
	CAPEM []byte
	// CertPEM and KeyPEM are the client certificate for mTLS (both or none).
	CertPEM, KeyPEM []byte
	// Pins are SHA-256 digests of SubjectPublicKeyInfo, checked after (never
	// instead of) chain verification: the leaf's SPKI must match one.
	Pins [][]byte
	// InsecureSkipVerify turns verification off. Default false.
	InsecureSkipVerify bool

	// Conns is the number of QUIC connections (default 1).
	Conns int
	// Streams is the number of bidirectional streams opened per connection
	// (default 32). Requests take them in turn, StreamBatch at a time.
	Streams int
	// StreamBatch is how many consecutive requests go to one stream before
	// the next stream takes over (default 16; 1 is a plain round robin).
	// Requests in flight together then share a stream, so one stream frame,
	// one wake-up of its reader and one of the server's carry several of
	// them: 0.85-0.9x the CPU per call on both sides at 50 calls in
	// flight. Frames of 16 KiB or more keep a plain round robin of
	// their own, so that a big frame does not hold up the small ones
	// behind it on one stream.
	StreamBatch int

	// DialTimeout bounds one connection attempt, handshake included
	// (default 5 s).
	DialTimeout time.Duration
	// IdleTimeout closes a connection that hears nothing from the peer for
	// this long (default 30 s). Keep-alives are sent at half of it so an
	// idle but healthy connection stays open.
	IdleTimeout time.Duration
	// MaxFrameSize bounds frames both ways and decompressed payloads
	// (default 16 MiB).
	MaxFrameSize int
	// ReceiveWindow bounds the per-stream receive window; the connection
	// window is 4× it (default 1 MiB, so 4 MiB per connection). Every nginx
	// worker has its own client, so this is per worker.
	ReceiveWindow int

	// Backoff for background re-dials; zero fields take the gRPC
	// connection-backoff defaults: 1 s, ×1.6, ±20 % jitter, 120 s cap.
	BackoffBase, BackoffMax time.Duration

	// CloseLinger is how long Close waits for the server to confirm it has
	// read everything sent (events included) before closing the
	// connections (default 1 s; negative: do not wait). A qrpc server of
	// this package confirms at once; others may make Close wait it out.
	CloseLinger time.Duration

	// Logger receives the client's own log lines (never request or response
	// bodies). Default: slog.Default().
	Logger *slog.Logger

	// skipConfirmation makes Dial return once the client's side of the
	// handshake is done, without waiting for the server to confirm it:
	// set only by tests (export_test.go), to let the server's verdict
	// arrive after Dial, as it can under load.
	skipConfirmation bool
}

func (c *Config) populate() (Config, error) {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.Conns == 0 {
		cfg.Conns = 1
	}
	if cfg.Streams == 0 {
		cfg.Streams = 32
	}
	if cfg.StreamBatch == 0 {
		cfg.StreamBatch = DefaultStreamBatch
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 30 * time.Second
	}
	if cfg.MaxFrameSize == 0 {
		cfg.MaxFrameSize = frame.DefaultMaxFrameSize
	}
	if cfg.ReceiveWindow == 0 {
		cfg.ReceiveWindow = 1 << 20
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = time.Second
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = 120 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CloseLinger == 0 {
		cfg.CloseLinger = time.Second
	}
	switch {
	case cfg.Conns < 1 || cfg.Conns > limits.Conns:
		return cfg, fmt.Errorf("%w: conns must be 1..%d, got %d", ErrBadConfig, limits.Conns, cfg.Conns)
	case cfg.Streams < 1 || cfg.Streams > limits.Streams:
		return cfg, fmt.Errorf("%w: streams must be 1..%d, got %d", ErrBadConfig, limits.Streams, cfg.Streams)
	case cfg.StreamBatch < 1 || cfg.StreamBatch > limits.StreamBatch:
		return cfg, fmt.Errorf("%w: stream batch must be 1..%d, got %d", ErrBadConfig, limits.StreamBatch, cfg.StreamBatch)
	case cfg.DialTimeout < 0 || cfg.IdleTimeout < 0:
		return cfg, fmt.Errorf("%w: negative timeout", ErrBadConfig)
	case cfg.MaxFrameSize < limits.MinFrameSize || cfg.MaxFrameSize > limits.MaxFrameSize:
		return cfg, fmt.Errorf("%w: max frame size must be 64..1 GiB, got %d", ErrBadConfig, cfg.MaxFrameSize)
	case (len(cfg.CertPEM) == 0) != (len(cfg.KeyPEM) == 0):
		return cfg, fmt.Errorf("%w: cert and key go together", ErrBadConfig)
	case cfg.ReceiveWindow < 16<<10:
		return cfg, fmt.Errorf("%w: receive window must be at least 16 KiB", ErrBadConfig)
	}
	for _, p := range cfg.Pins {
		if len(p) != sha256.Size {
			return cfg, fmt.Errorf("%w: a pin must be a 32-byte SHA-256 digest, got %d bytes", ErrBadConfig, len(p))
		}
	}
	return cfg, nil
}

func (c *Config) tlsConfig(addr string) (*tls.Config, error) {
	name := c.ServerName
	if name == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("%w: address %q: %v", ErrBadConfig, addr, err)
		}
		name = host
	}
	t := &tls.Config{
		ServerName:         name,
		NextProtos:         []string{ALPN},
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: c.InsecureSkipVerify,
	}
	if len(c.CAPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(c.CAPEM) {
			return nil, fmt.Errorf("%w: ca: no PEM certificate found", ErrBadConfig)
		}
		t.RootCAs = pool
	}
	if len(c.CertPEM) > 0 {
		cert, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
		if err != nil {
			return nil, fmt.Errorf("%w: client cert/key: %v", ErrBadConfig, err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	if len(c.Pins) > 0 {
		pins := c.Pins
		// VerifyConnection runs after chain verification (unless the caller
		// disabled it), so pins add to the chain check, not replace it.
		t.VerifyConnection = func(cs tls.ConnectionState) (err error) {
			// crypto/tls runs this on quic-go's goroutine: a panic would
			// end the process; it fails the handshake instead.
			defer safego.Recover("tls callback", func() { err = errCallbackPanic })
			safego.Inject("tls callback")
			if len(cs.PeerCertificates) == 0 {
				return errPinMismatch
			}
			sum := sha256.Sum256(cs.PeerCertificates[0].RawSubjectPublicKeyInfo)
			for _, p := range pins {
				if subtle.ConstantTimeCompare(sum[:], p) == 1 {
					return nil
				}
			}
			return errPinMismatch
		}
	}
	return t, nil
}

var errPinMismatch = errors.New("server public key matches no pin")

// errCallbackPanic fails what a callback run by quic-go or crypto/tls was
// doing when it panicked (the panic is reported and counted).
var errCallbackPanic = fmt.Errorf("%w: a callback panicked", ErrInternal)

func (c *Config) quicConfig() *quic.Config {
	win := uint64(c.ReceiveWindow)
	return &quic.Config{
		HandshakeIdleTimeout: c.DialTimeout,
		MaxIdleTimeout:       c.IdleTimeout,
		// Below the idle timeout (ours and, usually, the server's), so idle
		// connections between requests stay open. Half of it, the most
		// quic-go allows (it also caps the period at half the idle timeout
		// the server asks for): each keep-alive wakes an idle worker's Go
		// threads about 8 times, and a lost PING is sent again after a
		// probe timeout. A server gone silent is dropped about 1.5 × the
		// idle timeout after its last packet: quic-go counts idle time
		// from the first ack-eliciting packet sent after it
		// (idleTimeoutStartTime), here the keep-alive.
		KeepAlivePeriod:                c.IdleTimeout / 2,
		InitialStreamReceiveWindow:     min(win, 512<<10),
		MaxStreamReceiveWindow:         win,
		InitialConnectionReceiveWindow: min(4*win, 1<<20),
		MaxConnectionReceiveWindow:     4 * win,
		// The server never opens streams to a qrpc client.
		MaxIncomingStreams:    -1,
		MaxIncomingUniStreams: -1,
	}
}

// classifyDialError turns a quic-go/TLS failure into a short reason that
// tells the kinds of failure apart.
func classifyDialError(addr string, err error) error {
	reason := ReasonDialFailed
	var (
		unknownAuth x509.UnknownAuthorityError
		hostErr     x509.HostnameError
		certInvalid x509.CertificateInvalidError
		idle        *quic.IdleTimeoutError
		hs          *quic.HandshakeTimeoutError
		tErr        *quic.TransportError
		opErr       *net.OpError
		dnsErr      *net.DNSError
	)
	msg := err.Error()
	switch {
	case errors.As(err, &unknownAuth):
		reason = ReasonUnknownAuthority
	case errors.As(err, &hostErr):
		reason = ReasonWrongHost
	case errors.As(err, &certInvalid) && certInvalid.Reason == x509.Expired:
		reason = ReasonExpired
	case errors.As(err, &certInvalid):
		reason = ReasonCertInvalid
	case errors.Is(err, errPinMismatch):
		reason = ReasonPinMismatch
	case errors.As(err, &hs), errors.As(err, &idle):
		reason = ReasonTimeout
	case errors.As(err, &tErr) && tErr.ErrorCode == quic.TransportErrorCode(0x100+120):
		// TLS alert 120: no_application_protocol.
		reason = ReasonNoALPN
	case errors.As(err, &tErr) && tErr.ErrorCode == quic.TransportErrorCode(0x100+116):
		// Go's client sends no certificate when its own is not from a CA
		// the server lists, so this is also "wrong CA".
		reason = ReasonClientCertNeeded
	case errors.As(err, &tErr) && tErr.Remote && isCertAlert(tErr.ErrorCode):
		// The server's alert about the certificate we sent (our own verdicts
		// on its certificate are x509 errors, matched above).
		reason = ReasonClientCertBad
	case errors.As(err, &tErr) && tErr.ErrorCode.IsCryptoError():
		reason = ReasonTLSFailed
	case errors.As(err, &dnsErr):
		reason = ReasonNoHost
	case errors.As(err, &opErr) && opErr.Op == "dial":
		reason = ReasonUnreachable
	case bytes.Contains([]byte(msg), []byte("connection refused")):
		reason = ReasonRefused
	case errors.Is(err, errContextDeadline):
		reason = ReasonTimeout
	}
	return &DialError{Addr: addr, Reason: reason, Err: err}
}

// isCertAlert reports TLS alerts about a certificate: bad_certificate (42)
// through certificate_unknown (46), and unknown_ca (48).
func isCertAlert(code quic.TransportErrorCode) bool {
	alert := int(code) - 0x100
	return (alert >= 42 && alert <= 46) || alert == 48
}
