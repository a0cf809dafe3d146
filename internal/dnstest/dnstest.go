// Package dnstest is a small real DNS server on the loopback for tests of
// name re-resolution: it answers A queries for names, and SRV queries for
// SRV names, from lists the test changes. Only tests and the benchmark
// import it.
package dnstest

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Server answers A queries for its names from lists the test changes,
// SRV queries for its SRV names (with the A records of the targets it
// knows in the additional section, as name servers do), any other type
// for a known name with no records, and anything else with NXDOMAIN. It
// is a real UDP DNS server on 127.0.0.1.
type Server struct {
	Addr    string // host:port of the UDP server
	name    string
	mu      sync.Mutex
	a       map[string][]netip.Addr // by lower-case FQDN
	srv     map[string][]SRV
	queries atomic.Int64
	pc      net.PacketConn
	done    chan struct{}
}

// SRV is one SRV record: Target is a host name (with or without the
// final dot).
type SRV struct {
	Priority, Weight, Port uint16
	Target                 string
}

// Start starts a Server for name (fully qualified, with the final dot) and
// stops it when t ends.
func Start(t testing.TB, name string) *Server {
	t.Helper()
	d, err := Listen(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// Listen starts a Server for name that runs until Close (for a program
// that is not a test: the benchmark).
func Listen(name string) (*Server, error) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &Server{Addr: pc.LocalAddr().String(), name: name, pc: pc, done: make(chan struct{}),
		a: map[string][]netip.Addr{fqdn(name): nil}, srv: map[string][]SRV{}}
	go func() {
		defer close(d.done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := d.answer(buf[:n]); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
	return d, nil
}

// Close stops the server and waits for its goroutine.
func (d *Server) Close() {
	_ = d.pc.Close()
	<-d.done
}

// Set replaces the A records the server's name answers with.
func (d *Server) Set(ips ...string) { d.SetA(d.name, ips...) }

// SetA replaces the A records of name (it becomes known).
func (d *Server) SetA(name string, ips ...string) {
	a := []netip.Addr{}
	for _, s := range ips {
		a = append(a, netip.MustParseAddr(s))
	}
	d.mu.Lock()
	d.a[fqdn(name)] = a
	d.mu.Unlock()
}

// SetSRV replaces the SRV records of name (it becomes known; with no
// record, it answers SRV queries with none).
func (d *Server) SetSRV(name string, recs ...SRV) {
	d.mu.Lock()
	d.srv[fqdn(name)] = append([]SRV{}, recs...)
	d.mu.Unlock()
}

// Remove makes name unknown: NXDOMAIN.
func (d *Server) Remove(name string) {
	d.mu.Lock()
	delete(d.a, fqdn(name))
	delete(d.srv, fqdn(name))
	d.mu.Unlock()
}

func fqdn(name string) string {
	name = strings.ToLower(name)
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}

func (d *Server) answer(req []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	d.queries.Add(1)
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	key := fqdn(q.Name.String())
	d.mu.Lock()
	defer d.mu.Unlock()
	a, knownA := d.a[key]
	srvs, knownSRV := d.srv[key]
	if !knownA && !knownSRV {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	rr := func(name dnsmessage.Name) dnsmessage.ResourceHeader {
		return dnsmessage.ResourceHeader{Name: name, Class: dnsmessage.ClassINET, TTL: 1}
	}
	switch q.Type {
	case dnsmessage.TypeA:
		for _, ip := range a {
			_ = b.AResource(rr(q.Name), dnsmessage.AResource{A: ip.As4()})
		}
	case dnsmessage.TypeSRV:
		for _, r := range srvs {
			t, err := dnsmessage.NewName(fqdn(r.Target))
			if err != nil {
				continue
			}
			_ = b.SRVResource(rr(q.Name), dnsmessage.SRVResource{Priority: r.Priority, Weight: r.Weight, Port: r.Port, Target: t})
		}
		_ = b.StartAdditionals()
		for _, r := range srvs {
			if t, err := dnsmessage.NewName(fqdn(r.Target)); err == nil {
				for _, ip := range d.a[fqdn(r.Target)] {
					_ = b.AResource(rr(t), dnsmessage.AResource{A: ip.As4()})
				}
			}
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// Queries is how many questions the server has answered.
func (d *Server) Queries() int64 { return d.queries.Load() }
