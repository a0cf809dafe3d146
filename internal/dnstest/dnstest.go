// Package dnstest is a small real DNS server on the loopback for tests of
// name re-resolution: it answers A queries for one name from a list the
// test changes. Only tests import it.
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

// Server answers A queries for one name from a list the test changes,
// AAAA with no records, anything else with NXDOMAIN. It is a real UDP DNS
// server on 127.0.0.1.
type Server struct {
	Addr    string // host:port of the UDP server
	name    string
	mu      sync.Mutex
	a       []netip.Addr
	queries atomic.Int64
}

// Start starts a Server for name (fully qualified, with the final dot) and
// stops it when t ends.
func Start(t testing.TB, name string) *Server {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &Server{Addr: pc.LocalAddr().String(), name: name}
	done := make(chan struct{})
	go func() {
		defer close(done)
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
	t.Cleanup(func() {
		_ = pc.Close()
		<-done
	})
	return d
}

// Set replaces the A records the name answers with.
func (d *Server) Set(ips ...string) {
	var a []netip.Addr
	for _, s := range ips {
		a = append(a, netip.MustParseAddr(s))
	}
	d.mu.Lock()
	d.a = a
	d.mu.Unlock()
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
	known := strings.EqualFold(q.Name.String(), d.name)
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	if known && q.Type == dnsmessage.TypeA {
		d.mu.Lock()
		for _, ip := range d.a {
			_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1},
				dnsmessage.AResource{A: ip.As4()})
		}
		d.mu.Unlock()
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// Queries is how many questions the server has answered.
func (d *Server) Queries() int64 { return d.queries.Load() }
