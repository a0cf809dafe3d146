package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/observe"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// parseText reads an exposition into series -> value and checks that
// every sample's family was announced by HELP and TYPE lines before it.
func parseText(t *testing.T, text []byte) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	typed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(string(text), "\n"), "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			typed[strings.Fields(rest)[0]] = true
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			t.Fatalf("line without value: %q", line)
		}
		name, _, _ := strings.Cut(line[:sp], "{")
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if !typed[name] && !typed[base] {
			t.Fatalf("sample before its TYPE line: %q", line)
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if _, dup := out[line[:sp]]; dup {
			t.Fatalf("series printed twice: %q", line[:sp])
		}
		out[line[:sp]] = v
	}
	return out
}

func want(t *testing.T, got map[string]float64, series string, v float64) {
	t.Helper()
	g, ok := got[series]
	if !ok {
		t.Errorf("missing %s", series)
		return
	}
	if g != v {
		t.Errorf("%s = %v, want %v", series, g, v)
	}
}

var (
	errTimeout = fmt.Errorf("%w: no response within 1s", qrpc.ErrTimeout)
	errLost    = fmt.Errorf("%w: EOF", qrpc.ErrConnLost)
	errUnavail = fmt.Errorf("%w: reconnecting", qrpc.ErrUnavailable)
)

func TestExactCounts(t *testing.T) {
	r := New()
	p := r.Pool("a")
	s1 := p.Peer("10.0.0.1:8081")
	s2 := p.Peer("10.0.0.2:8081")
	greet := []byte("greet")
	for i := 0; i < 7; i++ {
		s1.CallDone(greet, 0, nil, 3*time.Millisecond)
	}
	s1.CallDone(greet, 5, nil, time.Millisecond) // 1 ms is the le="0.001" bucket
	s1.CallDone(greet, 0, errTimeout, 20*time.Second)
	s1.CallDone(greet, 0, errLost, 50*time.Microsecond)
	s1.CallDone(greet, 0, errUnavail, 0)
	s1.CallDone(greet, 0, qrpc.ErrClosed, time.Millisecond)
	s1.CallDone(greet, 0, fmt.Errorf("%w: x", qrpc.ErrTooLarge), time.Millisecond)
	s1.CallDone(greet, 0, qrpc.ErrQueueFull, time.Millisecond)
	s1.CallDone(greet, 0, &qrpc.DialError{Addr: "x", Reason: "timeout"}, time.Millisecond)
	s1.CallDone(greet, 0, errors.New("strange"), time.Millisecond)
	s2.CallDone(greet, 0, nil, 200*time.Millisecond)
	s2.EventDone([]byte("notify"), nil)
	s2.EventDone([]byte("notify"), nil)
	s2.EventDone([]byte("notify"), qrpc.ErrQueueFull)
	s1.InflightAdd(3)
	s1.InflightAdd(-1)
	s2.StateChanged(qrpc.PeerUp)
	s1.StateChanged(qrpc.PeerEjected)
	s1.Ejected()
	s1.Reconnected()
	s1.Reconnected()
	s1.BytesSent(100)
	s2.BytesSent(23)
	s2.BytesReceived(7)
	// A second pool to the same server adds into the same series.
	q := r.Pool("b").Peer("10.0.0.2:8081")
	q.CallDone(greet, 0, nil, 200*time.Millisecond)
	q.StateChanged(qrpc.PeerUp)

	got := parseText(t, r.Text())
	l1 := `method="greet",server="10.0.0.1:8081"`
	l2 := `method="greet",server="10.0.0.2:8081"`
	for res, n := range map[string]float64{"ok": 7, "code": 1, "timeout": 1, "connection_lost": 1, "unavailable": 1,
		"closed": 1, "too_large": 1, "queue_full": 1, "connect": 1, "other": 1} {
		want(t, got, `qrpc_client_calls_total{`+l1+`,result="`+res+`"}`, n)
	}
	want(t, got, `qrpc_client_calls_total{`+l2+`,result="ok"}`, 2)
	want(t, got, `qrpc_client_calls_total{`+l2+`,result="timeout"}`, 0)
	want(t, got, `qrpc_client_call_duration_seconds_count{`+l1+`}`, 16)
	want(t, got, `qrpc_client_call_duration_seconds_bucket{`+l1+`,le="0.0001"}`, 2) // 0 and 50 µs
	want(t, got, `qrpc_client_call_duration_seconds_bucket{`+l1+`,le="0.001"}`, 8)
	want(t, got, `qrpc_client_call_duration_seconds_bucket{`+l1+`,le="0.005"}`, 15)
	want(t, got, `qrpc_client_call_duration_seconds_bucket{`+l1+`,le="10"}`, 15)
	want(t, got, `qrpc_client_call_duration_seconds_bucket{`+l1+`,le="+Inf"}`, 16)
	want(t, got, `qrpc_client_call_duration_seconds_sum{`+l2+`}`, 0.4)
	want(t, got, `qrpc_client_call_duration_seconds_count{`+l2+`}`, 2)
	want(t, got, `qrpc_client_events_total{method="notify",server="10.0.0.2:8081",result="sent"}`, 2)
	want(t, got, `qrpc_client_events_total{method="notify",server="10.0.0.2:8081",result="dropped"}`, 1)
	want(t, got, `qrpc_client_inflight{server="10.0.0.1:8081"}`, 2)
	want(t, got, `qrpc_client_inflight{server="10.0.0.2:8081"}`, 0)
	want(t, got, `qrpc_client_connections{server="10.0.0.1:8081",state="ejected"}`, 1)
	want(t, got, `qrpc_client_connections{server="10.0.0.1:8081",state="up"}`, 0)
	want(t, got, `qrpc_client_connections{server="10.0.0.2:8081",state="up"}`, 2)
	want(t, got, `qrpc_client_reconnects_total{server="10.0.0.1:8081"}`, 2)
	want(t, got, `qrpc_client_ejections_total{server="10.0.0.1:8081"}`, 1)
	want(t, got, `qrpc_client_bytes_total{direction="sent"}`, 123)
	want(t, got, `qrpc_client_bytes_total{direction="received"}`, 7)
	// A method with events only has no call series, and the other way round.
	for k := range got {
		if strings.Contains(k, `method="notify"`) && !strings.HasPrefix(k, "qrpc_client_events_total") {
			t.Errorf("call series for an events-only method: %s", k)
		}
		if strings.Contains(k, `method="greet"`) && strings.HasPrefix(k, "qrpc_client_events_total") {
			t.Errorf("event series for a calls-only method: %s", k)
		}
	}
	// The same address reported again (left and came back) keeps its counters.
	if p.Peer("10.0.0.1:8081").(*peerView).Peer != s1.(*peerView).Peer {
		t.Error("a server reported twice got a new recorder")
	}
}

// TestStatesCountedPerPool: two pools to one server share its recorder;
// the connections gauge counts the server once per pool, and a pool's
// server leaves the gauge when that pool closes it.
func TestStatesCountedPerPool(t *testing.T) {
	r := New()
	a, b := r.Pool("k").Peer("10.0.0.9:1"), r.Pool("k").Peer("10.0.0.9:1")
	up := func() int64 { return r.Pool("k").PeerOf("10.0.0.9:1").states[qrpc.PeerUp].Load() }
	a.StateChanged(qrpc.PeerConnecting)
	b.StateChanged(qrpc.PeerConnecting)
	a.StateChanged(qrpc.PeerUp)
	b.StateChanged(qrpc.PeerUp)
	if got := up(); got != 2 {
		t.Fatalf("two pools up: gauge %d", got)
	}
	b.StateChanged(qrpc.PeerRemoved)
	if got := up(); got != 1 {
		t.Fatalf("one pool closed: gauge %d", got)
	}
	a.StateChanged(qrpc.PeerEjected)
	pe := r.Pool("k").PeerOf("10.0.0.9:1")
	if got, ej := up(), pe.states[qrpc.PeerEjected].Load(); got != 0 || ej != 1 {
		t.Fatalf("ejected: up %d ejected %d", got, ej)
	}
}

// TestHistogramCountEqualsCalls: concurrent recording, then the histogram
// count, the +Inf bucket and the sum of calls_total agree exactly.
func TestHistogramCountEqualsCalls(t *testing.T) {
	r := New()
	pe := r.Pool("").Peer("s:1")
	const goroutines, each = 8, 5000
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				var err error
				if i%10 == 0 {
					err = errTimeout
				}
				pe.CallDone([]byte("m"+strconv.Itoa(i%3)), uint32(i%7%2), err, time.Duration(i)*time.Microsecond)
			}
		}()
	}
	wg.Wait()
	got := parseText(t, r.Text())
	var calls, count, inf float64
	for k, v := range got {
		switch {
		case strings.HasPrefix(k, "qrpc_client_calls_total{"):
			calls += v
		case strings.HasPrefix(k, "qrpc_client_call_duration_seconds_count{"):
			count += v
		case strings.HasPrefix(k, "qrpc_client_call_duration_seconds_bucket{") && strings.Contains(k, `le="+Inf"`):
			inf += v
		}
	}
	if calls != goroutines*each || count != calls || inf != calls {
		t.Fatalf("calls_total %v, _count %v, +Inf %v; want %d each", calls, count, inf, goroutines*each)
	}
}

func TestMethodCardinalityCap(t *testing.T) {
	r := New()
	pe := r.Pool("").Peer("s:1")
	const n = MaxMethods + 44
	for i := 0; i < n; i++ {
		pe.CallDone([]byte(fmt.Sprintf("method-%03d", i)), 0, nil, time.Millisecond)
		pe.CallDone([]byte(fmt.Sprintf("method-%03d", i)), 0, nil, time.Millisecond)
	}
	got := parseText(t, r.Text())
	methods := map[string]bool{}
	for k := range got {
		if m, ok := strings.CutPrefix(k, `qrpc_client_calls_total{method="`); ok {
			methods[m[:strings.IndexByte(m, '"')]] = true
		}
	}
	if len(methods) != MaxMethods+1 {
		t.Fatalf("%d method labels, want %d + other", len(methods), MaxMethods)
	}
	want(t, got, `qrpc_client_calls_total{method="method-000",server="s:1",result="ok"}`, 2)
	want(t, got, `qrpc_client_calls_total{method="method-255",server="s:1",result="ok"}`, 2)
	want(t, got, `qrpc_client_calls_total{method="other",server="s:1",result="ok"}`, 2*44)
	// Another pool has a table of its own.
	r.Pool("second").Peer("s:1").CallDone([]byte("method-299"), 0, nil, time.Millisecond)
	want(t, parseText(t, r.Text()), `qrpc_client_calls_total{method="method-299",server="s:1",result="ok"}`, 1)
}

func TestServerCardinalityCap(t *testing.T) {
	r := New()
	p := r.Pool("")
	for i := 0; i < MaxServers+3; i++ {
		p.Peer(fmt.Sprintf("10.0.%d.%d:1", i/256, i%256)).Reconnected()
	}
	got := parseText(t, r.Text())
	want(t, got, `qrpc_client_reconnects_total{server="other"}`, 3)
	n := 0
	for k := range got {
		if strings.HasPrefix(k, "qrpc_client_reconnects_total{") {
			n++
		}
	}
	if n != MaxServers+1 {
		t.Fatalf("%d server labels, want %d + other", n, MaxServers)
	}
}

// TestRecordersBounded: a worker that connects to ever new sets of
// servers (what callers pass to connect is not ours to bound) keeps a
// bounded number of recorders, and every call is still counted.
func TestRecordersBounded(t *testing.T) {
	r := New()
	const sets = 4 * MaxPools
	for i := 0; i < sets; i++ {
		p := r.Pool(fmt.Sprintf("10.1.%d.%d:1,10.2.%d.%d:1", i/256, i%256, i/256, i%256))
		for _, a := range []string{"10.1", "10.2"} {
			p.PeerOf(fmt.Sprintf("%s.%d.%d:1", a, i/256, i%256)).CallDone([]byte("m"), 0, nil, time.Millisecond)
		}
	}
	peers := 0
	for _, p := range r.order {
		peers += len(p.list)
	}
	if len(r.order) > MaxPools+1 || peers > MaxServers+MaxPools+1 {
		t.Fatalf("%d pools and %d recorders kept for %d sets of 2 servers", len(r.order), peers, sets)
	}
	got := parseText(t, r.Text())
	calls := 0.0
	for k, v := range got {
		if strings.HasPrefix(k, "qrpc_client_calls_total{") {
			calls += v
		}
	}
	if calls != 2*sets {
		t.Fatalf("%v calls counted, want %d", calls, 2*sets)
	}
	want(t, got, `qrpc_client_calls_total{method="m",server="other",result="ok"}`, 2*sets-MaxServers)
}

// TestGaugesPastBounds: servers of pools past MaxPools keys (the overflow
// pool) and past MaxServers addresses (one recorder for server="other")
// open, change state, carry calls in flight and close in a random order;
// every scrape's connections and inflight gauges equal what is open now,
// per server label, never more, never less.
func TestGaugesPastBounds(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	r := New()
	type server struct {
		o        observe.PeerObserver
		label    string
		state    qrpc.PeerState
		inflight int
	}
	labels := map[string]string{} // what serverLabel hands out
	label := func(addr string) string {
		if l, ok := labels[addr]; ok {
			return l
		}
		if len(labels) >= MaxServers {
			return Other
		}
		labels[addr] = addr
		return addr
	}
	var open []*server
	for step := 1; step <= 40000; step++ {
		switch x := rng.Intn(10); {
		case x < 3:
			key := fmt.Sprintf("k%d", rng.Intn(MaxPools+150))
			addr := fmt.Sprintf("10.0.%d.%d:1", rng.Intn(2), rng.Intn(MaxServers/2+50))
			s := &server{o: r.Pool(key).Peer(addr), label: label(addr), state: qrpc.PeerConnecting}
			s.o.StateChanged(qrpc.PeerConnecting)
			open = append(open, s)
		case len(open) == 0:
		case x == 3:
			s := open[rng.Intn(len(open))]
			s.o.InflightAdd(1)
			s.inflight++
		case x == 4:
			if s := open[rng.Intn(len(open))]; s.inflight > 0 {
				s.o.InflightAdd(-1)
				s.inflight--
			}
		default:
			i := rng.Intn(len(open))
			s := open[i]
			s.state = qrpc.PeerState(rng.Intn(numStates))
			s.o.StateChanged(s.state)
			if s.state == qrpc.PeerRemoved {
				s.o.InflightAdd(-s.inflight)
				open = append(open[:i], open[i+1:]...)
			}
		}
		if step%5000 != 0 {
			continue
		}
		wantG := map[string]float64{}
		for _, s := range open {
			if int(s.state) < len(stateLabels) {
				wantG[nameConnections+`{server="`+s.label+`",state="`+stateLabels[s.state]+`"}`]++
			}
			wantG[nameInflight+`{server="`+s.label+`"}`] += float64(s.inflight)
		}
		for k, v := range parseText(t, r.Text()) {
			if strings.HasPrefix(k, nameConnections+"{") || strings.HasPrefix(k, nameInflight+"{") {
				if v != wantG[k] {
					t.Fatalf("step %d, %d servers open: %s = %v, want %v", step, len(open), k, v, wantG[k])
				}
				delete(wantG, k)
			}
		}
		for k, v := range wantG {
			if v != 0 {
				t.Fatalf("step %d: %s not listed, want %v", step, k, v)
			}
		}
	}
	if len(r.order) != MaxPools+1 || len(labels) != MaxServers {
		t.Fatalf("%d pools, %d server labels: the bounds were not passed", len(r.order), len(labels))
	}
}

func TestEscaping(t *testing.T) {
	r := New()
	pe := r.Pool("").Peer(`odd"host\:1`)
	pe.CallDone([]byte("a\"b\\c\nd"), 0, nil, time.Millisecond)
	pe.CallDone([]byte("bad\xffutf8"), 0, nil, time.Millisecond)
	pe.CallDone([]byte(strings.Repeat("x", 300)), 0, nil, time.Millisecond)
	text := string(r.Text())
	for _, s := range []string{
		`qrpc_client_calls_total{method="a\"b\\c\nd",server="odd\"host\\:1",result="ok"} 1`,
		"qrpc_client_calls_total{method=\"bad\uFFFDutf8\",server=\"odd\\\"host\\\\:1\",result=\"ok\"} 1",
		`qrpc_client_calls_total{method="` + strings.Repeat("x", maxLabelLen) + `",server="odd\"host\\:1",result="ok"} 1`,
	} {
		if !strings.Contains(text, s+"\n") {
			t.Errorf("missing line %s", s)
		}
	}
	if strings.Count(text, "\n") != len(strings.Split(strings.TrimSuffix(text, "\n"), "\n")) {
		t.Error("a raw newline inside a line")
	}
	checkPromtool(t, r.Text())
}

func TestNoAllocation(t *testing.T) {
	r := New()
	pe := r.Pool("").Peer("s:1")
	m := []byte("greet")
	pe.CallDone(m, 0, nil, time.Millisecond)
	n := testing.AllocsPerRun(1000, func() {
		pe.CallDone(m, 0, nil, time.Millisecond)
		pe.CallDone(m, 3, nil, time.Millisecond)
		pe.CallDone(m, 0, errTimeout, time.Millisecond)
		pe.EventDone(m, nil)
		pe.InflightAdd(1)
	})
	if n != 0 {
		t.Fatalf("%v allocations per recording", n)
	}
}

// worker simulates what the Lua side does with a worker's snapshot and a
// lua_shared_dict: counters added as deltas, gauges under a per-pid key.
type worker struct {
	pid  int
	reg  *Registry
	last map[string]float64
}

type dict map[string]float64

func (w *worker) flush(d dict) {
	for _, line := range strings.Split(strings.TrimSuffix(string(w.reg.Snapshot()), "\n"), "\n") {
		sp := strings.LastIndexByte(line, ' ')
		kind, series := line[:1], line[2:sp]
		v, _ := strconv.ParseFloat(line[sp+1:], 64)
		if kind == "g" {
			d["g"+strconv.Itoa(w.pid)+" "+series] = v
			continue
		}
		if delta := v - w.last[series]; delta != 0 {
			d[series] += delta
			w.last[series] = v
		}
	}
}

func (w *worker) exit(d dict) {
	w.flush(d)
	for k := range d {
		if strings.HasPrefix(k, "g"+strconv.Itoa(w.pid)+" ") {
			delete(d, k)
		}
	}
}

func (d dict) dump() []byte {
	var b bytes.Buffer
	for k, v := range d {
		fmt.Fprintf(&b, "%s %s\n", k, strconv.FormatFloat(v, 'g', 17, 64))
	}
	return b.Bytes()
}

// TestAcrossWorkers: two workers flush deltas into one dict, several
// times and at exit; the rendered sums are exact and the gauges of a
// worker that exited no longer count.
func TestAcrossWorkers(t *testing.T) {
	d := dict{"someone else's key": 5}
	w1 := &worker{pid: 101, reg: New(), last: map[string]float64{}}
	w2 := &worker{pid: 102, reg: New(), last: map[string]float64{}}
	a := w1.reg.Pool("x").Peer("s:1")
	b := w2.reg.Pool("x").Peer("s:1")
	for round := 0; round < 3; round++ {
		for i := 0; i < 10; i++ {
			a.CallDone([]byte("greet"), 0, nil, time.Millisecond)
		}
		for i := 0; i < 5; i++ {
			b.CallDone([]byte("greet"), 0, nil, 30*time.Millisecond)
			b.CallDone([]byte("greet"), 0, errTimeout, time.Second)
		}
		w1.flush(d)
		w2.flush(d)
	}
	a.InflightAdd(4)
	b.InflightAdd(2)
	a.StateChanged(qrpc.PeerUp)
	b.StateChanged(qrpc.PeerUp)
	w1.flush(d)
	w2.flush(d)
	render := func() map[string]float64 {
		out, err := Render(d.dump())
		if err != nil {
			t.Fatal(err)
		}
		checkPromtool(t, out)
		return parseText(t, out)
	}
	got := render()
	l := `method="greet",server="s:1"`
	want(t, got, `qrpc_client_calls_total{`+l+`,result="ok"}`, 30+15)
	want(t, got, `qrpc_client_calls_total{`+l+`,result="timeout"}`, 15)
	want(t, got, `qrpc_client_call_duration_seconds_count{`+l+`}`, 60)
	want(t, got, `qrpc_client_call_duration_seconds_bucket{`+l+`,le="0.001"}`, 30)
	want(t, got, `qrpc_client_call_duration_seconds_bucket{`+l+`,le="0.05"}`, 45)
	want(t, got, `qrpc_client_inflight{server="s:1"}`, 6)
	want(t, got, `qrpc_client_connections{server="s:1",state="up"}`, 2)

	w2.exit(d)
	got = render()
	want(t, got, `qrpc_client_inflight{server="s:1"}`, 4)
	want(t, got, `qrpc_client_connections{server="s:1",state="up"}`, 1)
	want(t, got, `qrpc_client_calls_total{`+l+`,result="ok"}`, 45) // counters stay

	if _, err := Render([]byte("qrpc_client_calls_total{method=\"x 1\n")); !errors.Is(err, ErrBadSample) {
		t.Fatalf("unterminated label: %v, want ErrBadSample", err)
	}
	if _, err := Render([]byte("qrpc_client_calls_total{method=\"x\"} many\n")); !errors.Is(err, ErrBadSample) {
		t.Fatalf("bad value: %v, want ErrBadSample", err)
	}
}

// checkPromtool runs `promtool check metrics` on text. Outside CI a
// machine without promtool skips; in CI (CI=true) it must be there.
func checkPromtool(t *testing.T, text []byte) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found (Debian package prometheus); CI must install it")
		}
		t.Log("promtool not found (Debian package prometheus): not checked")
		return
	}
	f := filepath.Join(t.TempDir(), "metrics.txt")
	if err := os.WriteFile(f, text, 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = in
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("promtool check metrics: %v\n%s\ninput:\n%s", err, out, text)
	}
}

func TestPromtool(t *testing.T) {
	r := New()
	pe := r.Pool("").Peer("127.0.0.1:8081")
	pe.CallDone([]byte("greet"), 0, nil, time.Millisecond)
	pe.EventDone([]byte("notify"), nil)
	pe.StateChanged(qrpc.PeerUp)
	checkPromtool(t, r.Text())
	checkPromtool(t, New().Text()) // nothing recorded yet
}

// BenchmarkRecordCall: one successful call recorded. Besides ns/op (wall
// time, inflated when the machine is shared) it reports cpu-ns/op, the
// process's CPU time per recording.
func BenchmarkRecordCall(b *testing.B) {
	r := New()
	pe := r.Pool("").Peer("127.0.0.1:8081")
	m := []byte("greet")
	b.ReportAllocs()
	before := cpuTime()
	for i := 0; b.Loop(); i++ {
		pe.CallDone(m, 0, nil, time.Duration(i&1023)*time.Microsecond)
	}
	b.ReportMetric(float64(cpuTime()-before)/float64(b.N), "cpu-ns/op")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkRecordCallParallel(b *testing.B) {
	r := New()
	pe := r.Pool("").Peer("127.0.0.1:8081")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		m := []byte("greet")
		i := 0
		for pb.Next() {
			pe.CallDone(m, 0, nil, time.Duration(i&1023)*time.Microsecond)
			i++
		}
	})
}

func BenchmarkRecordCallError(b *testing.B) {
	r := New()
	pe := r.Pool("").Peer("127.0.0.1:8081")
	m := []byte("greet")
	b.ReportAllocs()
	for b.Loop() {
		pe.CallDone(m, 0, errTimeout, time.Second)
	}
}

// TestSnapshotWhileRecording: snapshots taken while calls are recorded
// (new methods and servers appearing too) never see a counter go down,
// and the final one is exact.
func TestSnapshotWhileRecording(t *testing.T) {
	r := New()
	p := r.Pool("")
	const goroutines, each = 4, 3000
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pe := p.Peer("s:" + strconv.Itoa(g%2))
			for i := 0; i < each; i++ {
				var err error
				if i%3 == 0 {
					err = errLost
				}
				pe.CallDone([]byte("m"+strconv.Itoa(i%40)), 0, err, time.Duration(i)*time.Microsecond)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	prev := map[string]float64{}
	check := func() {
		for _, line := range strings.Split(strings.TrimSuffix(string(r.Snapshot()), "\n"), "\n") {
			if !strings.HasPrefix(line, "c ") {
				continue
			}
			sp := strings.LastIndexByte(line, ' ')
			v, _ := strconv.ParseFloat(line[sp+1:], 64)
			if v < prev[line[2:sp]] {
				t.Fatalf("%s went down from %v to %v", line[2:sp], prev[line[2:sp]], v)
			}
			prev[line[2:sp]] = v
		}
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		check()
	}
	check()
	var calls float64
	for k, v := range prev {
		if strings.HasPrefix(k, "qrpc_client_calls_total{") {
			calls += v
		}
	}
	if calls != goroutines*each {
		t.Fatalf("calls_total sums to %v, want %d", calls, goroutines*each)
	}
}

func TestQuery(t *testing.T) {
	r := New()
	r.Pool("").Peer("s:1").CallDone([]byte("m"), 0, nil, time.Millisecond)
	text, err := r.Query("", nil)
	if err != nil || !bytes.Contains(text, []byte(`qrpc_client_calls_total{method="m",server="s:1",result="ok"} 1`+"\n")) {
		t.Fatalf("text: %v\n%s", err, text)
	}
	snap, err := r.Query("snapshot", nil)
	if err != nil || !bytes.Contains(snap, []byte(`c qrpc_client_calls_total{method="m",server="s:1",result="ok"} 1`+"\n")) {
		t.Fatalf("snapshot: %v\n%s", err, snap)
	}
	out, err := r.Query("render", []byte(`qrpc_client_calls_total{method="m",server="s:1",result="ok"} 5`+"\n"))
	if err != nil || !bytes.Contains(out, []byte(`qrpc_client_calls_total{method="m",server="s:1",result="ok"} 5`+"\n")) {
		t.Fatalf("render: %v\n%s", err, out)
	}
	if _, err := r.Query("nope", nil); err == nil {
		t.Fatal("unknown query accepted")
	}
}

// TestThrottledCounted: a pool's throttled calls are one counter by
// method, with no server label.
func TestThrottledCounted(t *testing.T) {
	r := New()
	p := r.Pool("k")
	for range 3 {
		p.Throttled([]byte("greet"))
	}
	p.Throttled([]byte("other\"one"))
	text := string(r.Text())
	for _, want := range []string{
		"# TYPE qrpc_client_throttled_total counter\n",
		"qrpc_client_throttled_total{method=\"greet\"} 3\n",
		"qrpc_client_throttled_total{method=\"other\\\"one\"} 1\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in\n%s", want, text)
		}
	}
}

// TestRenderOrder: whatever order the lines come in (a dict's keys come
// in none), a family's lines are sorted by their labels, a histogram's by
// bucket (numerically, +Inf last), then sum, then count; le is taken out
// wherever it stands among the labels; samples of one series add up.
func TestRenderOrder(t *testing.T) {
	const h = "qrpc_client_call_duration_seconds"
	in := strings.Join([]string{
		h + `_count{method="b",server="s"} 3`,
		h + `_bucket{method="b",server="s",le="+Inf"} 3`,
		h + `_bucket{le="0.5",method="b",server="s"} 2`,
		h + `_bucket{method="b",le="10",server="s"} 3`,
		h + `_bucket{method="b",server="s",le="2"} 2`,
		h + `_sum{method="b",server="s"} 4.5`,
		h + `_bucket{method="a",server="s",le="+Inf"} 1`,
		h + `_bucket{method="a",server="s",le="0.5"} 1`,
		h + `_count{method="a",server="s"} 1`,
		h + `_sum{method="a",server="s"} 0.25`,
		`g101 ` + h + `_count{method="a",server="s"} 1`,
		`qrpc_client_inflight{server="z"} 1`,
		`qrpc_client_inflight{server="y"} 2`,
	}, "\n")
	out, err := Render([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, h) || strings.HasPrefix(line, "qrpc_client_inflight{") {
			got = append(got, line)
		}
	}
	wantLines := []string{
		h + `_bucket{method="a",server="s",le="0.5"} 1`,
		h + `_bucket{method="a",server="s",le="+Inf"} 1`,
		h + `_sum{method="a",server="s"} 0.25`,
		h + `_count{method="a",server="s"} 2`,
		h + `_bucket{method="b",server="s",le="0.5"} 2`,
		h + `_bucket{method="b",server="s",le="2"} 2`,
		h + `_bucket{method="b",server="s",le="10"} 3`,
		h + `_bucket{method="b",server="s",le="+Inf"} 3`,
		h + `_sum{method="b",server="s"} 4.5`,
		h + `_count{method="b",server="s"} 3`,
		`qrpc_client_inflight{server="y"} 2`,
		`qrpc_client_inflight{server="z"} 1`,
	}
	if strings.Join(got, "\n") != strings.Join(wantLines, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantLines, "\n"))
	}
}

// TestRenderTwoLE: a bucket key with le twice (a dict shared with
// something else can hold any key) is an error, not a printed line that
// names le twice (promtool check metrics does not see it).
func TestRenderTwoLE(t *testing.T) {
	const b = "qrpc_client_call_duration_seconds_bucket"
	for _, key := range []string{
		b + `{le="1",le="2"}`,
		b + `{method="m",le="1",server="s",le="+Inf"}`,
		b + `{le="0.5",method="m",le="1"}`,
	} {
		out, err := Render([]byte(key + " 1\n"))
		if !errors.Is(err, ErrBadSample) {
			t.Errorf("%s: %v, want ErrBadSample; rendered:\n%s", key, err, out)
		}
	}
}

// BenchmarkText: what qrpc.metrics() costs the nginx thread for a fleet
// of 20 servers with 10 methods each (about 6,100 lines).
func BenchmarkText(b *testing.B) {
	r := fleet()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r.Text()
	}
}

// BenchmarkSnapshot: what each second's flush into metrics_dict costs the
// nginx thread in Go for the same fleet (Lua then adds what changed into
// the dict).
func BenchmarkSnapshot(b *testing.B) {
	r := fleet()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r.Snapshot()
	}
}

// fleet: 20 servers with 10 methods called, each with an answer and a
// timeout (about 6,100 lines).
func fleet() *Registry {
	r := New()
	for s := 0; s < 20; s++ {
		pe := r.Pool(fmt.Sprintf("pool%d", s)).PeerOf(fmt.Sprintf("10.0.0.%d:4433", s))
		for m := 0; m < 10; m++ {
			name := []byte(fmt.Sprintf("svc.Method%d", m))
			pe.CallDone(name, 0, nil, time.Millisecond)
			pe.CallDone(name, 0, errTimeout, time.Second)
		}
	}
	return r
}
