package main

import (
	"errors"
	"math"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
)

func TestPercentile(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var d []time.Duration
		for _, x := range n {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	cases := []struct {
		lats []time.Duration
		q    float64
		want time.Duration
	}{
		{nil, 0.5, 0},
		{ms(7), 0.99, 7 * time.Millisecond},
		{ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{ms(hundred...), 0.5, 50 * time.Millisecond},
		{ms(hundred...), 0.99, 99 * time.Millisecond},
		{ms(hundred...), 1, 100 * time.Millisecond},
		{ms(hundred...), 0, 1 * time.Millisecond},
	}
	for _, c := range cases {
		if got := percentile(c.lats, c.q); got != c.want {
			t.Errorf("percentile(%d latencies, %g) = %v, want %v", len(c.lats), c.q, got, c.want)
		}
	}
}

func TestLineResult(t *testing.T) {
	lats := []time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond}
	r := lineResult(lats, 2*time.Second)
	if r.reqs != 4 || r.rps != 2 || r.p50 != 2*time.Millisecond || r.p99 != 4*time.Millisecond {
		t.Errorf("lineResult: %+v", r)
	}
}

// The both-at-once baseline: each kind's calls at its own cost alone.
func TestMixCPU(t *testing.T) {
	if got := mixCPU(300, 100, 40, 20); math.Abs(got-35) > 1e-9 {
		t.Errorf("mixCPU(300, 100, 40, 20) = %g, want 35", got)
	}
	if got := mixCPU(0, 0, 40, 20); got != 0 {
		t.Errorf("mixCPU with no calls = %g, want 0", got)
	}
	r := loadRound{
		bothHTTP:   wrkResult{reqs: 300},
		bothStream: wrkResult{reqs: 100},
		httpCost:   loadCost{calls: 1000, cpu: 40 * time.Millisecond, main: 30 * time.Millisecond, csw: 500},
		streamCost: loadCost{calls: 1000, cpu: 20 * time.Millisecond, main: 10 * time.Millisecond, csw: 100},
		bothCost:   loadCost{calls: 400, cpu: 12 * time.Millisecond, main: 8 * time.Millisecond, csw: 200},
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"alone CPU for the mix", r.aloneForMix(loadCost.cpuUS), 35},
		{"both CPU", r.bothCost.cpuUS(), 30},
		{"alone nginx thread for the mix", r.aloneForMix(loadCost.mainUS), 25},
		{"both nginx thread", r.bothCost.mainUS(), 20},
		{"alone other threads for the mix", r.aloneForMix(loadCost.otherUS), 10},
		{"both other threads", r.bothCost.otherUS(), 10},
		{"alone switches for the mix", r.aloneForMix(loadCost.cswPer), 0.4},
		{"both switches", r.bothCost.cswPer(), 0.5},
		{"no calls", loadCost{cpu: time.Second}.cpuUS(), 0},
	} {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("%s = %g, want %g", c.name, c.got, c.want)
		}
	}
}

// costOf reads the CPU time of the process and of its main thread.
func TestCostOf(t *testing.T) {
	c, err := costOf(os.Getpid(), func() (int, error) {
		end := time.Now().Add(30 * time.Millisecond)
		for time.Now().Before(end) { // the test's own thread, busy
		}
		return 3, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The process's and the thread's figures are read at two instants in
	// clock ticks (10 ms): the thread's may be one tick ahead.
	const tick = 10 * time.Millisecond
	if c.calls != 3 || c.cpu+tick < c.main || c.cpu < 0 || c.main < 0 {
		t.Errorf("costOf: %+v", c)
	}
	boom := errors.New("boom")
	if _, err := costOf(os.Getpid(), func() (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Errorf("a failed load: %v", err)
	}
}

func TestParseStatCPU(t *testing.T) {
	// pid (comm with) spaces) state ppid ... utime=fields 14, stime=15
	line := "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 125 0 0 20 0 1 0 10 1000 100"
	d, err := parseStatCPU("stat", line)
	if err != nil || d != 3750*time.Millisecond {
		t.Errorf("parseStatCPU: %v %v, want 3.75s", d, err)
	}
	if _, err := parseStatCPU("stat", "42 (x) S 1"); err == nil {
		t.Error("a short line: no error")
	}
}

func TestAlternate(t *testing.T) {
	var order []string
	side := func(name string, v time.Duration) func() (callStats, error) {
		return func() (callStats, error) {
			order = append(order, name)
			return callStats{d: v}, nil
		}
	}
	as, bs, err := alternate(3, side("a", 1), side("b", 2))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, ""); got != "abbaab" {
		t.Errorf("order %q, want abbaab", got)
	}
	for i := range as {
		if as[i].d != 1 || bs[i].d != 2 {
			t.Errorf("run %d: a %v b %v: results swapped", i, as[i].d, bs[i].d)
		}
	}
	boom := errors.New("boom")
	if _, _, err := alternate(2, side("a", 1), func() (callStats, error) { return callStats{}, boom }); !errors.Is(err, boom) {
		t.Errorf("an error of a side: %v", err)
	}
}

func TestParseStats(t *testing.T) {
	n := &nginx{dir: t.TempDir()}
	st, err := n.parseStats("loop", `{"secs":0.5,"calls":1000,"errors":0,"cpu":0.04,"csw":3500}`+"\n")
	if err != nil {
		t.Fatal(err)
	}
	if st.d != 500*time.Millisecond || st.cpu != 40*time.Millisecond || st.csw != 3500 {
		t.Errorf("parseStats: %+v", st)
	}
	for _, bad := range []string{
		`{"secs":0.5,"calls":1000,"errors":2,"cpu":0.04,"csw":3500}`,
		`{"secs":0.5,"calls":0,"errors":0,"cpu":0,"csw":0}`,
		`ERR bad arguments`,
	} {
		if _, err := n.parseStats("loop", bad); err == nil {
			t.Errorf("parseStats(%q): no error", bad)
		}
	}
}

// A stand-in line server: the load counts answers, and an ERR answer
// fails it.
func TestLineLoad(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					answer := "xxxx\n"
					if strings.HasPrefix(string(buf[:n]), "fail") {
						answer = "ERR failed on purpose\n"
					}
					if _, err := c.Write([]byte(answer)); err != nil {
						return
					}
				}
			}()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	r, err := lineLoad(port, 3, 100*time.Millisecond, "call 4")
	if err != nil {
		t.Fatal(err)
	}
	if r.reqs == 0 || r.rps <= 0 || r.p99 < r.p50 {
		t.Errorf("lineLoad: %+v", r)
	}
	if _, err := lineLoad(port, 2, 50*time.Millisecond, "fail"); err == nil || !strings.Contains(err.Error(), "failed on purpose") {
		t.Errorf("an ERR answer: %v", err)
	}
	if got, err := askLine(port, "call 4", 5*time.Second); err != nil || got != "xxxx" {
		t.Errorf("askLine: %q %v", got, err)
	}
}

// Without the binary the section is skipped with the reason.
func TestStreamNginxMissing(t *testing.T) {
	t.Setenv("QRPC_BUILD_DIR", t.TempDir())
	ng, why := streamNginx("")
	if ng != nil || !strings.Contains(why, "make nginx-openresty") {
		t.Errorf("streamNginx with no build: %v %q", ng, why)
	}
	if ng, why := streamNginx("/nonexistent/sbin/nginx"); ng != nil || why == "" {
		t.Errorf("streamNginx of a missing path: %v %q", ng, why)
	}
	// Debian's nginx has no stream Lua module
	if bin, err := ngxtest.LookPath("nginx"); err == nil {
		if ng, err := ngxtest.Probe(bin); err == nil && !ng.StreamLua {
			if got, why := streamNginx(bin); got != nil || why != ng.NoStreamLua {
				t.Errorf("streamNginx(%s): %v %q, want the reason %q", bin, got, why, ng.NoStreamLua)
			}
		}
	}
}

func TestSpread(t *testing.T) {
	a := []callStats{{cpu: 30}, {cpu: 10}, {cpu: 22}}
	b := []callStats{{cpu: 20}, {cpu: 10}, {cpu: 20}}
	r := pairRatios(a, b, statCPUSecs)
	if len(r) != 3 || math.Abs(r[0]-1.5) > 1e-9 || math.Abs(r[1]-1) > 1e-9 || math.Abs(r[2]-1.1) > 1e-9 {
		t.Errorf("pairRatios: %v", r)
	}
	if got := spread(r); got != "1.00–1.50" {
		t.Errorf("spread: %q", got)
	}
	if got := spread(nil); got != "none" {
		t.Errorf("spread of none: %q", got)
	}
}
