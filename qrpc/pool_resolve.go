package qrpc

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

func netipParse(host string) (netip.Addr, error) { return netip.ParseAddr(host) }

// newResolver returns the system's resolver, or one that sends every query
// to addr (as nginx's resolver directive does): over UDP, and over TCP
// when Go's resolver asks for it, to repeat a question whose UDP answer
// came truncated (TC).
func newResolver(addr string) *net.Resolver {
	if addr == "" {
		return net.DefaultResolver
	}
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, resolverNetwork(network), addr)
		},
	}
}

// resolverNetwork is the network to reach the resolver on when Go's
// resolver asks for network ("udp" or "tcp", perhaps with a 4 or 6 that
// is its server's family, not the configured one's): the same transport,
// of whichever family addr has.
func resolverNetwork(network string) string {
	if strings.HasPrefix(network, "tcp") {
		return "tcp"
	}
	return "udp"
}

func (p *Pool) hasNames() bool {
	for _, t := range p.targets {
		if !t.literal {
			return true
		}
	}
	return false
}

// resolve returns the server addresses the targets stand for, sorted and
// without duplicates, the name each resolved address came from (its TLS
// server name), and the priority and weight of the addresses an SRV name
// gave. A name that does not resolve is an error.
func (p *Pool) resolve(ctx context.Context) ([]string, map[string]string, map[string]srvMeta, error) {
	return resolveAll(ctx, p.targets, p.conf.DialTimeout, func(ctx context.Context, host string) ([]netip.Addr, error) {
		return p.resolver.LookupNetIP(ctx, "ip", host)
	}, func(ctx context.Context, name string) ([]*net.SRV, error) {
		_, srvs, err := p.resolver.LookupSRV(ctx, "", "", name)
		return srvs, err
	})
}

// srvMeta is what an SRV record says of the addresses of its target.
// Addresses of plain names and literals have priority 0, weight 1.
type srvMeta struct {
	prio   uint16
	weight uint16
	// split is how many addresses the record's target has: they share
	// its weight (RFC 2782 weighs targets, not addresses).
	split uint16
}

var plainMeta = srvMeta{weight: 1}

// IsSRVName reports whether a pool address is an SRV name,
// "_service._proto.name" (no port): the name itself says it.
func IsSRVName(a string) bool { return isSRVName(a) }

func isSRVName(a string) bool {
	labels := strings.Split(strings.TrimSuffix(a, "."), ".")
	if len(labels) < 3 || strings.Contains(a, ":") {
		return false
	}
	for _, l := range labels[:2] {
		if len(l) < 2 || l[0] != '_' {
			return false
		}
	}
	for _, l := range labels[2:] {
		if l == "" {
			return false
		}
	}
	return true
}

// resolveTargets is resolve with its lookup given, for pools without SRV
// names: a name's addresses are keyed to that name, so that two names on
// one port each keep their own. An address two names share keeps the
// first.
func resolveTargets(ctx context.Context, targets []target, timeout time.Duration,
	lookup func(context.Context, string) ([]netip.Addr, error)) ([]string, map[string]string, error) {
	out, names, _, err := resolveAll(ctx, targets, timeout, lookup, nil)
	return out, names, err
}

// resolveAll is resolve with its lookups given. An SRV name stands for
// the addresses of each of its targets (A and AAAA), on the record's port,
// verified against the target's name; a target that does not resolve is
// left out, and an SRV name none of whose targets resolves (or that has no
// record, or does not exist) is a name that does not resolve. An address
// two records share keeps the first's priority (the lowest).
func resolveAll(ctx context.Context, targets []target, timeout time.Duration,
	lookup func(context.Context, string) ([]netip.Addr, error),
	lookupSRV func(context.Context, string) ([]*net.SRV, error)) ([]string, map[string]string, map[string]srvMeta, error) {
	seen := map[string]bool{}
	names := map[string]string{}
	meta := map[string]srvMeta{}
	var out []string
	add := func(a, name string, m srvMeta) {
		if !seen[a] {
			seen[a] = true
			if name != "" {
				names[a] = name
			}
			meta[a] = m
			out = append(out, a)
		}
	}
	lookupIPs := func(host, port string) ([]netip.Addr, error) {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		ips, err := lookup(rctx, host)
		cancel()
		if err == nil && len(ips) == 0 {
			err = fmt.Errorf("no address")
		}
		if err != nil {
			return nil, &DialError{Addr: net.JoinHostPort(host, port), Reason: "cannot resolve host", Err: err}
		}
		return ips, nil
	}
	for _, t := range targets {
		switch {
		case t.literal:
			add(net.JoinHostPort(t.host, t.port), "", plainMeta)
		case t.srv:
			if lookupSRV == nil {
				return nil, nil, nil, fmt.Errorf("%w: SRV name %q: no SRV resolver", ErrBadConfig, t.host)
			}
			rctx, cancel := context.WithTimeout(ctx, timeout)
			srvs, err := lookupSRV(rctx, t.host)
			cancel()
			var live []*net.SRV
			for _, r := range srvs {
				// "." is the name service saying there is no such service.
				if r.Target != "." && r.Target != "" {
					live = append(live, r)
				}
			}
			if len(live) == 0 {
				if err == nil {
					err = fmt.Errorf("no SRV record")
				}
				return nil, nil, nil, &DialError{Addr: t.host, Reason: "cannot resolve host", Err: err}
			}
			// Lowest priority first: an address two records share keeps
			// the one that would use it first.
			sort.SliceStable(live, func(i, j int) bool { return live[i].Priority < live[j].Priority })
			var lastErr error
			n := len(out)
			for _, r := range live {
				host := strings.TrimSuffix(r.Target, ".")
				port := strconv.Itoa(int(r.Port))
				ips, err := lookupIPs(host, port)
				if err != nil {
					lastErr = err
					continue
				}
				for _, ip := range ips {
					add(net.JoinHostPort(ip.Unmap().String(), port), host, srvMeta{prio: r.Priority, weight: r.Weight, split: uint16(min(len(ips), 0xffff))})
				}
			}
			if len(out) == n && lastErr != nil {
				return nil, nil, nil, lastErr
			}
		default:
			ips, err := lookupIPs(t.host, t.port)
			if err != nil {
				return nil, nil, nil, err
			}
			for _, ip := range ips {
				add(net.JoinHostPort(ip.Unmap().String(), t.port), t.host, plainMeta)
			}
		}
	}
	if len(out) > maxPeers {
		return nil, nil, nil, fmt.Errorf("%w: %d servers, at most %d", ErrBadConfig, len(out), maxPeers)
	}
	sort.Strings(out)
	return out, names, meta, nil
}

// serverName is the TLS name for a server: the configured one, else the
// name the address came from (not the IP it resolved to), else its host.
func (p *Pool) serverName(addr string, names map[string]string) string {
	if p.conf.ServerName != "" {
		return p.conf.ServerName
	}
	if n, ok := names[addr]; ok {
		return n
	}
	host, _, _ := net.SplitHostPort(addr)
	return host
}

func (p *Pool) peerConf(addr string, names map[string]string) Config {
	conf := p.conf
	conf.ServerName = p.serverName(addr, names)
	return conf
}

// addSync dials the only server now, as Dial does.
func (p *Pool) addSync(ctx context.Context, addr string, names map[string]string, meta map[string]srvMeta) error {
	pr := newPeer(p, addr)
	pr.setMeta(meta[addr])
	conf := p.peerConf(addr, names)
	pr.name = conf.ServerName
	tlsConf, err := conf.tlsConfig(addr)
	if err != nil {
		pr.gone()
		return err
	}
	c := newClient(addr, conf, tlsConf, pr.obs, pr.refresh)
	pr.c = c // before connect starts the goroutines that read it
	if err := c.connect(ctx); err != nil {
		// Never joined: the observer hears of its end, the log does not
		// (the caller reports the dial error).
		pr.gone()
		return err
	}
	p.mu.Lock()
	p.peers[addr] = pr
	p.publish()
	p.mu.Unlock()
	pr.refresh()
	return nil
}

// apply makes want the pool's servers: new ones join (dialled in the
// background), missing ones drain. It returns the first error of a server
// that could not be added (its configuration: the TLS material, the same
// for every server). A server whose SRV priority or weight changed keeps
// its connection and takes its new share. Called with p.mu held.
func (p *Pool) apply(want []string, names map[string]string, meta map[string]srvMeta) error {
	var firstErr error
	keep := make(map[string]bool, len(want))
	changed, lostUp := false, false
	for _, a := range want {
		keep[a] = true
		name := p.serverName(a, names)
		if pr := p.peers[a]; pr != nil && pr.name == name {
			changed = pr.setMeta(meta[a]) || changed
			continue
		} else if pr != nil {
			// The same address under another TLS name: a new client
			// checks the new name; the old one drains.
			delete(p.peers, a)
			p.startDrain(pr)
			changed = true
		}
		if pr := p.draining[a]; pr != nil && pr.name == name {
			pr.setMeta(meta[a])
			// Back before it was gone: it takes calls again.
			delete(p.draining, a)
			p.transition(pr, event{kind: evUndrain})
			p.peers[a] = pr
			changed = true
			continue
		}
		if len(p.peers) >= maxPeers {
			if firstErr == nil {
				firstErr = fmt.Errorf("%w: more than %d servers", ErrBadConfig, maxPeers)
			}
			continue
		}
		pr := newPeer(p, a)
		pr.name = name
		pr.setMeta(meta[a])
		c, err := dialBackground(a, p.peerConf(a, names), pr.obs, pr.refresh)
		if err != nil {
			p.log.Warn("qrpc server not added", "addr", a, "err", err)
			pr.gone()
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		pr.c = c
		c.startSlots()
		p.peers[a] = pr
		p.log.Info("qrpc server added", "addr", a)
		changed = true
	}
	for a, pr := range p.peers {
		if keep[a] {
			continue
		}
		delete(p.peers, a)
		lostUp = lostUp || pr.takes()
		p.startDrain(pr)
		changed = true
	}
	if changed {
		p.publish()
	}
	if lostUp {
		p.keepOneUp(p.set.Load().peers)
	}
	return firstErr
}

// takes reports whether pr is up and not ejected: a server that takes
// calls.
func (pr *peer) takes() bool {
	h := pr.h.Load()
	return !h.ejected() && !h.draining && pr.c.up()
}

// publish replaces the snapshot the call path reads. Called with p.mu held.
func (p *Pool) publish() {
	peers := make([]*peer, 0, len(p.peers))
	for _, pr := range p.peers {
		peers = append(peers, pr)
	}
	sort.Slice(peers, func(i, j int) bool { return peers[i].addr < peers[j].addr })
	set := &peerSet{peers: peers, tiers: buildTiers(peers)}
	p.set.Store(set)
}

// keepOneUp lifts the ejection that ends first among the servers up when
// DNS took out the servers that were up and not ejected (an ejection
// allowed while one of them was up). Called with p.mu held.
func (p *Pool) keepOneUp(peers []*peer) {
	var first *peer
	var until int64
	for _, pr := range peers {
		h := pr.h.Load()
		if h.draining || !pr.c.up() {
			continue
		}
		if !h.ejected() {
			return
		}
		if first == nil || h.until < until {
			first, until = pr, h.until
		}
	}
	if first != nil {
		p.transition(first, event{kind: evLastUp})
	}
}

// startDrain moves pr (out of p.peers) to the draining servers. Called
// with p.mu held.
func (p *Pool) startDrain(pr *peer) {
	if old := p.draining[pr.addr]; old != nil && old != pr {
		// An older client of the same address (another TLS name)
		// still draining: it goes now.
		delete(p.draining, pr.addr)
		safego.Go("pool drain", func() { _ = old.c.Close(); p.transition(old, event{kind: evRemove}) }, nil)
	}
	p.transition(pr, event{kind: evDrain})
	p.draining[pr.addr] = pr
	p.wg.Add(1)
	// A drain that panics closes its server at once: its calls in
	// flight end as on a lost connection, rather than the server staying
	// open and listed as draining until the pool closes.
	safego.Go("pool drain", func() { p.drain(pr); p.wg.Done() }, func() { p.drained(pr); p.wg.Done() })
}

// drain waits for the calls in flight on a removed server, then closes it.
// A server that comes back meanwhile (apply) stops the drain.
// Its caller marks p.wg done after it (and after the clean-up of a panic
// in it, so that Close waits for that too).
func (p *Pool) drain(pr *peer) {
	safego.Inject("pool drain")
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for pr.inflight.Load() > 0 {
		select {
		case <-t.C:
		case <-p.ctx.Done():
			return // Close closes it
		}
		if !pr.h.Load().draining {
			return
		}
	}
	p.drained(pr)
}

// drained closes a draining server and takes it out of the pool, unless
// it came back meanwhile.
func (p *Pool) drained(pr *peer) {
	p.mu.Lock()
	if !pr.h.Load().draining || p.draining[pr.addr] != pr {
		p.mu.Unlock()
		return
	}
	delete(p.draining, pr.addr)
	p.mu.Unlock()
	_ = pr.c.Close()
	p.transition(pr, event{kind: evRemove})
}

func (p *Pool) resolveLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.cfg.Resolve)
	defer t.Stop()
	for {
		if !p.roundDue(leaseResolve, t.C) {
			return
		}
		if !p.roleHeld(leaseResolve) {
			continue // another view resolves (pool_share.go)
		}
		// A panic ends the round, not the loop: the next round resolves.
		safego.Run("pool resolver", p.resolveRound, nil)
	}
}

// resolveRound re-resolves the names once and applies the result.
func (p *Pool) resolveRound() {
	want, names, meta, err := p.resolve(p.ctx)
	safego.Inject("pool resolver")
	if err != nil {
		if p.ctx.Err() == nil {
			p.log.Warn("qrpc re-resolution failed; servers unchanged", "err", err)
		}
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed.Load() {
		p.noteResolved(want, names, meta)
		_ = p.apply(want, names, meta) // logged per server
	}
}

// roundDue waits for role l's next round: the ticker's tick, or, while p
// is shared and another view holds the role, the share timer's kick when
// this view wins it (pool_share_tick.go), so that a view without the role
// waits without a timer. false: p is closing.
func (p *Pool) roundDue(l int, tick <-chan time.Time) bool {
	kick := p.roleKick(l)
	if kick != nil && !p.roleHeld(l) {
		tick = nil
	}
	select {
	case <-tick:
	case <-kick:
	case <-p.ctx.Done():
		return false
	}
	return true
}

// checkLoop runs the active health check of every server each interval.
func (p *Pool) checkLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.cfg.Check.Interval)
	defer t.Stop()
	for {
		if !p.roundDue(leaseProbe, t.C) {
			return
		}
		if !p.roleHeld(leaseProbe) {
			continue // another view probes (pool_share.go)
		}
		peers := p.set.Load().peers
		done := make(chan struct{}, len(peers))
		for _, pr := range peers {
			safego.Go("pool probe", func() {
				defer func() { done <- struct{}{} }()
				p.check(pr)
			}, nil)
		}
		for range peers {
			<-done
		}
	}
}

func (p *Pool) check(pr *peer) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.Check.Timeout)
	defer cancel()
	safego.Inject("pool probe")
	began := p.clk.Now()
	_, err := pr.c.Unary(ctx, p.cfg.Check.Method, nil)
	if p.ctx.Err() != nil {
		return
	}
	if err == nil {
		// Any answer: the server is alive.
		now := p.clk.Now()
		pr.answered(now, now.Sub(began))
		if h := pr.h.Load(); h.ejected() || h.fails != 0 {
			p.transition(pr, event{kind: evCheckOK})
		}
		return
	}
	p.outcome(pr, 0, err)
}
