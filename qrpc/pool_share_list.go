package qrpc

import "slices"

// What a step of a shared pool (pool_share.go) hands the pool: the
// address list the resolving view published, the other views' throttling
// window.

// Resolved is one address of the list the resolving view found.
type Resolved struct {
	Addr     string
	Name     string // TLS server name ("" : the address's host)
	Priority uint16
	Weight   uint16
	Split    uint16 // addresses of its SRV target (they share Weight)
}

// SetOthersThrottle gives adaptive throttling the other views' window
// (their requests and accepts over the last two minutes): the pool then
// sheds on the sum, as one pool would. No-op without throttling.
func (p *Pool) SetOthersThrottle(requests, accepts int64) {
	if th := p.throttle; th != nil {
		th.otherReqs.Store(max(0, requests))
		th.otherAccs.Store(max(0, accepts))
	}
}

// noteResolved keeps the list this view resolved, for the others. Called
// with p.mu held.
func (p *Pool) noteResolved(want []string, names map[string]string, meta map[string]srvMeta) {
	list := make([]Resolved, 0, len(want))
	for _, a := range want {
		m := meta[a]
		list = append(list, Resolved{Addr: a, Name: names[a], Priority: m.prio, Weight: max(m.weight, 1), Split: max(m.split, 1)})
	}
	if slices.Equal(list, p.share.resolved) && p.share.resolvedGen != 0 {
		return
	}
	p.share.resolved = list
	p.share.resolvedGen++
	if p.share.on.Load() {
		p.shareChanged() // published at the next step
	}
}

// resolvedArgs turns a resolved list into apply's arguments: sorted
// addresses (the first of a duplicate kept), TLS names, SRV metadata.
func resolvedArgs(list []Resolved) ([]string, map[string]string, map[string]srvMeta) {
	want := make([]string, 0, len(list))
	names := map[string]string{}
	meta := map[string]srvMeta{}
	for _, r := range list {
		if _, dup := meta[r.Addr]; dup {
			continue
		}
		want = append(want, r.Addr)
		if r.Name != "" {
			names[r.Addr] = r.Name
		}
		meta[r.Addr] = srvMeta{prio: r.Priority, weight: max(r.Weight, 1), split: max(r.Split, 1)}
	}
	slices.Sort(want)
	return want, names, meta
}

// ImportResolved makes list the pool's servers, as its own re-resolution
// would (new ones join, missing ones drain; at most maxPeers). It does
// nothing on a pool without names to resolve, or on an empty list.
func (p *Pool) ImportResolved(list []Resolved) error {
	if len(list) == 0 || !p.hasNames() {
		return nil
	}
	if len(list) > maxPeers {
		list = list[:maxPeers]
	}
	want, names, meta := resolvedArgs(list)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return ErrClosed
	}
	return p.apply(want, names, meta)
}
