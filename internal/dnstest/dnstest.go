// Package dnstest is a small real DNS server on the loopback for tests of
// name re-resolution: it answers A queries for names, and SRV queries for
// SRV names, from lists the test changes. Only tests and the benchmark
// import it.
package dnstest

import (
	"encoding/binary"
	"io"
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
// is a real DNS server on 127.0.0.1, over UDP and TCP on the same port.
// As name servers do, it answers over UDP within the size the question
// allows (512 bytes, or its EDNS0 payload size): an answer that does not
// fit goes out with the TC bit and no records, for the client to ask
// again over TCP, where every answer is whole.
type Server struct {
	Addr    string // host:port of the server (UDP and TCP)
	name    string
	mu      sync.Mutex
	a       map[string][]netip.Addr // by lower-case FQDN
	srv     map[string][]SRV
	queries atomic.Int64
	pc      net.PacketConn
	ln      net.Listener
	conns   sync.WaitGroup
	cmu     sync.Mutex
	open    map[net.Conn]struct{}
	done    chan struct{}
}

// udpMin is the UDP answer size every client takes (RFC 1035); a question
// with an EDNS0 record may allow more.
const udpMin = 512

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
	pc, ln, err := listen()
	if err != nil {
		return nil, err
	}
	d := &Server{Addr: pc.LocalAddr().String(), name: name, pc: pc, ln: ln, done: make(chan struct{}),
		open: map[net.Conn]struct{}{},
		a:    map[string][]netip.Addr{fqdn(name): nil}, srv: map[string][]SRV{}}
	d.conns.Add(1)
	go func() {
		defer d.conns.Done()
		d.serveTCP()
	}()
	go func() {
		defer close(d.done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := d.answer(buf[:n], true); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
	return d, nil
}

// listen opens a UDP socket on a free port of 127.0.0.1 and a TCP
// listener on the same port (a few tries: the port may be taken for TCP).
func listen() (net.PacketConn, net.Listener, error) {
	var err error
	for range 20 {
		var pc net.PacketConn
		pc, err = net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		var ln net.Listener
		ln, err = net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln, nil
		}
		_ = pc.Close()
	}
	return nil, nil, err
}

// serveTCP answers length-prefixed questions on each connection, whole.
func (d *Server) serveTCP() {
	for {
		c, err := d.ln.Accept()
		if err != nil {
			return
		}
		d.cmu.Lock()
		if d.open == nil { // closed
			d.cmu.Unlock()
			_ = c.Close()
			return
		}
		d.open[c] = struct{}{}
		d.conns.Add(1)
		d.cmu.Unlock()
		go func() {
			defer d.conns.Done()
			defer func() {
				d.cmu.Lock()
				delete(d.open, c)
				d.cmu.Unlock()
				_ = c.Close()
			}()
			for {
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				req := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, req); err != nil {
					return
				}
				out := d.answer(req, false)
				if out == nil || len(out) > 0xffff {
					return
				}
				binary.BigEndian.PutUint16(l[:], uint16(len(out)))
				if _, err := c.Write(append(l[:], out...)); err != nil {
					return
				}
			}
		}()
	}
}

// Close stops the server and waits for its goroutines.
func (d *Server) Close() {
	_ = d.pc.Close()
	_ = d.ln.Close()
	d.cmu.Lock()
	for c := range d.open {
		_ = c.Close()
	}
	d.open = nil
	d.cmu.Unlock()
	d.conns.Wait()
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

// answer builds the answer to req; over UDP (udp), one that does not fit
// the size the question allows is cut to its question, with TC set.
func (d *Server) answer(req []byte, udp bool) []byte {
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
	out := d.build(h, q)
	if udp && out != nil && len(out) > udpLimit(&p) {
		rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, Truncated: true}
		b := dnsmessage.NewBuilder(nil, rh)
		_ = b.StartQuestions()
		_ = b.Question(q)
		out, _ = b.Finish()
	}
	return out
}

// udpLimit is the UDP answer size a question allows: its EDNS0 payload
// size (RFC 6891), at least 512; 512 without one. p has read the
// question.
func udpLimit(p *dnsmessage.Parser) int {
	if p.SkipAllQuestions() != nil || p.SkipAllAnswers() != nil || p.SkipAllAuthorities() != nil {
		return udpMin
	}
	for {
		rh, err := p.AdditionalHeader()
		if err != nil { // dnsmessage.ErrSectionDone: no EDNS0 record
			return udpMin
		}
		if rh.Type == dnsmessage.TypeOPT {
			return max(int(rh.Class), udpMin)
		}
		if p.SkipAdditional() != nil {
			return udpMin
		}
	}
}

// build is the whole answer to question q of a query with header h.
func (d *Server) build(h dnsmessage.Header, q dnsmessage.Question) []byte {
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
