package metrics

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/observe"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Registry holds the figures of one process (one nginx worker). Recording
// is lock-free: atomics on counters that exist once a (method, server) has
// been seen. Locks are taken only when a pool, server or method name is new
// and when a snapshot is written.
type Registry struct {
	mu      sync.Mutex
	pools   map[string]*Pool
	order   []*Pool        // pools in creation order, for a stable snapshot
	servers map[string]int // server labels handed out, capped at MaxServers
	extra   atomic.Pointer[func(add func(series string, v float64))]
	sizes   [2]atomic.Int64 // the last snapshot's counters and gauges
}

// SetExtraCounters has each snapshot add the counters f reports (series
// as the exposition prints them, of a family listed in families, with
// bounded label values): the built-in host's per-VM completions.
func (r *Registry) SetExtraCounters(f func(add func(series string, v float64))) {
	r.extra.Store(&f)
}

// New returns an empty registry.
func New() *Registry {
	return &Registry{pools: make(map[string]*Pool), servers: make(map[string]int)}
}

// Pool returns the Observer for the pool known by key, creating it on first
// use. A pool closed and created again with the same key (the same
// connect options) gets the same Observer back, so its counters carry on
// and the registry does not grow with every re-creation.
//
// Keys are what callers connect to, so their number is not ours to
// bound: past MaxPools keys, every new key gets one overflow Pool, whose
// method table they share.
func (r *Registry) Pool(key string) *Pool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.pools[key]; p != nil {
		return p
	}
	if len(r.pools) >= MaxPools {
		key = "\x00" + Other // no dialled key starts with NUL
		if p := r.pools[key]; p != nil {
			return p
		}
	}
	p := &Pool{r: r, peers: make(map[string]*Peer)}
	empty := map[string]uint16{}
	p.methods.Store(&empty)
	r.pools[key] = p
	r.order = append(r.order, p)
	return p
}

// Peer makes the Registry itself an Observer: that of the pool with the
// empty key.
func (r *Registry) Peer(addr string) observe.PeerObserver { return r.Pool("").Peer(addr) }

// serverLabel returns addr, or Other once MaxServers labels are in use.
// Called with r.mu held.
func (r *Registry) serverLabel(addr string) string {
	if !utf8.ValidString(addr) {
		addr = strings.ToValidUTF8(addr, "\uFFFD")
	}
	if _, ok := r.servers[addr]; ok {
		return addr
	}
	if len(r.servers) >= MaxServers {
		return Other
	}
	r.servers[addr] = len(r.servers)
	return addr
}

// Pool is the observe.Observer of one pool: its own method-name table and the
// servers it has reported.
type Pool struct {
	r *Registry

	// methods maps a method name to its index in every Peer's series. The
	// map is never modified once published: a new name is added to a copy
	// (at most MaxMethods copies of at most MaxMethods entries), so a
	// lookup needs no lock.
	methods atomic.Pointer[map[string]uint16]
	full    atomic.Bool // MaxMethods names are in: misses go to Other without the lock
	mu      sync.Mutex  // serialises adding a name
	names   []string    // label value by index; append-only, read under mu

	peers map[string]*Peer // by server label; guarded by r.mu
	list  []*Peer          // guarded by r.mu

	// throttled counts calls adaptive throttling rejected, by method
	// index: such a call has no server to be counted under.
	throttled [MaxMethods + 1]atomic.Uint64
}

var _ qrpc.ThrottleObserver = (*Pool)(nil)

// Throttled counts a call the pool's adaptive throttling rejected.
func (p *Pool) Throttled(method []byte) { p.throttled[p.method(method)].Add(1) }

// otherIndex is the series slot of method="other".
const otherIndex = MaxMethods

// Peer returns the observer of one server of a qrpc.Pool: a view on the
// recorder of that address, which every pool with the same key shares (and
// which a server that left and came back gets again, so its counters never
// go back); the view counts this pool's server in the connections gauge.
func (p *Pool) Peer(addr string) observe.PeerObserver {
	return &peerView{Peer: p.PeerOf(addr), cur: -1}
}

// PeerOf is Peer with the concrete type, for a caller that records with
// Series handles.
func (p *Pool) PeerOf(addr string) *Peer {
	r := p.r
	r.mu.Lock()
	defer r.mu.Unlock()
	// By label: the servers past MaxServers share one recorder, so that
	// the recorders are bounded as the labels are.
	label := r.serverLabel(addr)
	if pe := p.peers[label]; pe != nil {
		return pe
	}
	pe := &Peer{pool: p, server: label}
	p.peers[label] = pe
	p.list = append(p.list, pe)
	return pe
}

// method returns the series index of a method name. The map lookup with
// string(name) as key does not allocate.
func (p *Pool) method(name []byte) int {
	if i, ok := (*p.methods.Load())[string(name)]; ok {
		return int(i)
	}
	if p.full.Load() {
		return otherIndex
	}
	return p.addMethod(name)
}

func (p *Pool) addMethod(name []byte) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := *p.methods.Load()
	if i, ok := old[string(name)]; ok {
		return int(i)
	}
	if len(old) >= MaxMethods {
		p.full.Store(true)
		return otherIndex
	}
	m := make(map[string]uint16, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	i := len(old)
	m[string(name)] = uint16(i)
	p.names = append(p.names, MethodLabel(name))
	p.methods.Store(&m)
	return i
}

// MethodLabel makes a method name fit as a label value: valid UTF-8, at
// most maxLabelLen bytes. Two names that become the same label share its
// series when rendered. The Lua side's series of a method
// (qrpc_client_deadline_expired_total) take their label from
// method_label in lua/resty/ffi/qrpc/metrics.lua, which must give the
// same (TestMethodLabelLuaMatchesGo, in nginx/).
func MethodLabel(name []byte) string {
	s := strings.ToValidUTF8(string(name), "\uFFFD")
	if len(s) > maxLabelLen {
		s = s[:maxLabelLen]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// methodName returns the label of index i.
func (p *Pool) methodName(i int) string {
	if i == otherIndex {
		return Other
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.names[i]
}

// Peer records the events of one server of a pool. It implements
// observe.PeerObserver.
type Peer struct {
	pool   *Pool
	server string

	series [MaxMethods + 1]atomic.Pointer[Series] // by method index; Other last

	inflight   atomic.Int64
	states     [numStates]atomic.Int64 // servers of open pools in each state
	selfMu     sync.Mutex              // guards selfCur, selfSet (StateChanged)
	selfCur    int
	selfSet    bool
	reconnects atomic.Uint64
	ejections  atomic.Uint64
	retries    [numResults]atomic.Uint64 // by the failure's result; resOK: hedged copies
	budget     atomic.Uint64
	sent, recv atomic.Uint64
}

// Series is what is counted per (method, server).
//
// A successful call costs two atomic adds: its bucket in okBuckets and the
// sum. The ok count is the sum of okBuckets, so it needs no counter of its
// own and stays monotonic. Other results add to calls[result] and to
// otherBuckets.
type Series struct {
	okBuckets    [numBuckets]atomic.Uint64 // not cumulative; the last is +Inf
	otherBuckets [numBuckets]atomic.Uint64
	calls        [numResults]atomic.Uint64 // calls[resOK] stays 0
	sumNs        atomic.Uint64
	events       [2]atomic.Uint64 // sent, dropped
}

// Series returns the recorder of one method of this server. A caller
// that cannot keep the method name until the call ends (it lives in the
// caller's memory) resolves it here when the call starts and records on
// the Series when it ends.
func (pe *Peer) Series(method []byte) *Series {
	i := pe.pool.method(method)
	if s := pe.series[i].Load(); s != nil {
		return s
	}
	s := new(Series)
	if pe.series[i].CompareAndSwap(nil, s) {
		return s
	}
	return pe.series[i].Load()
}

// CallDone counts one unary attempt and its duration.
func (pe *Peer) CallDone(method []byte, code uint32, err error, elapsed time.Duration) {
	pe.Series(method).CallDone(code, err, elapsed)
}

// CallDone counts one unary attempt of this method and its duration.
func (s *Series) CallDone(code uint32, err error, elapsed time.Duration) {
	b := 0
	for b < len(bucketBounds) && elapsed > bucketBounds[b] {
		b++
	}
	switch {
	case err != nil:
		s.calls[resultOf(err)].Add(1)
		s.otherBuckets[b].Add(1)
	case code != 0:
		s.calls[resCode].Add(1)
		s.otherBuckets[b].Add(1)
	default:
		s.okBuckets[b].Add(1)
	}
	if elapsed > 0 {
		s.sumNs.Add(uint64(elapsed))
	}
}

// resultOf maps an error to its result label through the error's first
// word, the same word callers see.
func resultOf(err error) int {
	switch qrpc.ErrorWord(err) {
	case qrpc.WordTimeout:
		return resTimeout
	case qrpc.WordUnavailable:
		return resUnavailable
	case qrpc.WordConnLost:
		return resConnLost
	case qrpc.WordClosed:
		return resClosed
	case qrpc.WordTooLarge:
		return resTooLarge
	case qrpc.WordQueueFull:
		return resQueueFull
	case qrpc.WordConnect:
		return resConnect
	case qrpc.WordInternal:
		return resInternal
	}
	return resOther
}

// EventDone counts a one-way event: sent, or dropped for any error.
func (pe *Peer) EventDone(method []byte, err error) { pe.Series(method).EventDone(err) }

// EventDone counts a one-way event of this method.
func (s *Series) EventDone(err error) {
	if err == nil {
		s.events[0].Add(1)
	} else {
		s.events[1].Add(1)
	}
}

// InflightAdd moves the in-flight gauge.
func (pe *Peer) InflightAdd(delta int) { pe.inflight.Add(int64(delta)) }

// numStates counts qrpc.PeerState values (PeerRemoved last).
const numStates = int(qrpc.PeerRemoved) + 1

// StateChanged records the state of the server for the connections gauge
// when the Peer itself is the observer: it then stands for one server of
// one pool. The recorder of server="other" stands for many servers (and
// every recorder for one per pool that shares it), whose states it cannot
// tell apart: pools observe through Pool.Peer, a view per pool's server.
func (pe *Peer) StateChanged(state qrpc.PeerState) {
	pe.selfMu.Lock()
	defer pe.selfMu.Unlock()
	from := -1
	if pe.selfSet {
		from = pe.selfCur
	}
	pe.moveState(from, state)
	pe.selfCur, pe.selfSet = int(state), true
}

// moveState moves one server from state from (-1: none) to state to.
func (pe *Peer) moveState(from int, to qrpc.PeerState) {
	if from >= 0 && from < numStates {
		pe.states[from].Add(-1)
	}
	if int(to) < numStates {
		pe.states[to].Add(1)
	}
}

// peerView is one pool's server on a Peer that several pools to the same
// server share (connections with different options): the series are
// shared, the state is counted once per pool.
type peerView struct {
	*Peer
	mu  sync.Mutex
	cur int // -1 until the first state
}

// StateChanged moves this pool's server from its last state to state.
func (v *peerView) StateChanged(state qrpc.PeerState) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.Peer.moveState(v.cur, state)
	v.cur = int(state)
}

// Reconnected counts a re-established connection.
func (pe *Peer) Reconnected() { pe.reconnects.Add(1) }

// Ejected counts a health ejection.
func (pe *Peer) Ejected() { pe.ejections.Add(1) }

// Retried counts a call retried after err on this server.
func (pe *Peer) Retried(err error) { pe.retries[resultOf(err)].Add(1) }

// Hedged counts a copy sent because this server was slow to answer.
func (pe *Peer) Hedged() { pe.retries[resOK].Add(1) }

// BudgetExhausted counts a retry or copy the budget refused.
func (pe *Peer) BudgetExhausted() { pe.budget.Add(1) }

// BytesSent counts frame bytes sent.
func (pe *Peer) BytesSent(n int) { pe.sent.Add(uint64(n)) }

// BytesReceived counts frame bytes received.
func (pe *Peer) BytesReceived(n int) { pe.recv.Add(uint64(n)) }

var (
	_ observe.Observer     = (*Registry)(nil)
	_ observe.Observer     = (*Pool)(nil)
	_ observe.PeerObserver = (*Peer)(nil)
)
