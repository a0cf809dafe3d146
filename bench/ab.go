package main

// A/B of two builds of the library on the pinned sequential call
// (-only ab -ab-lib path): the build of the tree (B) against another
// (A, e.g. the commit before a change), each in an nginx of its own
// pinned to CPU 0 with the servers on the other CPUs, in interleaved
// rounds (the order flips every round) so that a slow spell of this
// shared machine lands on both. Per round: 100 B sequential unary calls
// and the same number of IPC echoes (the hand-off alone, no network),
// with the Go client's same calls as the yardstick.

import (
	"flag"
	"fmt"
	"log"
	"path/filepath"
	"sort"
	"strings"
)

var (
	abLib    = flag.String("ab-lib", "", "ab figure: the build of the library to compare the tree's with (A)")
	abLua    = flag.String("ab-lua", "", "ab figure: A's lua directory (the one holding resty/ffi/qrpc.lua), e.g. a checkout of the commit before; A's library is then the tree's unless -ab-lib")
	abRounds = flag.Int("ab-rounds", 9, "ab figure: interleaved rounds")
	abN      = flag.Int("ab-n", 3000, "ab figure: sequential calls per build per round")
	abPin    = flag.Bool("ab-pin", true, "ab figure: the nginx workers and the Go client on CPU 0, the servers on the others (false: all unpinned)")
	abC      = flag.Int("ab-c", 1, "ab figure: light threads (and Go client goroutines) making the calls at once; 1 = sequential")
	abGMP    = flag.String("ab-gomaxprocs", "", "ab figure: GOMAXPROCS of both nginx workers and the Go client (\"\" = the library's default)")
)

// abSide is one build's nginx and its rounds.
type abSide struct {
	name  string
	n     *nginx
	unary []callStats
	ipc   []callStats
}

func figureAB(e *env, p params, t *table) error {
	defer e.restore(p)
	if *abLib == "" && *abLua == "" {
		t.note("A/B skipped: no -ab-lib or -ab-lua.")
		return nil
	}
	aLib, aName := *abLib, *abLib
	if aLib == "" {
		aLib = e.lib
	}
	if *abLua != "" {
		aName = strings.TrimPrefix(aName+" with lua "+*abLua, " with ")
	}
	if why := placementUsable(); why != "" {
		t.note("A/B skipped: %s.", why)
		return nil
	}
	pl := placement{name: "pinned to CPU 0", pin: *abPin, gomaxprocs: *abGMP}
	if err := e.apply(pl); err != nil { // the servers on the other CPUs
		return err
	}
	e.nginx.stop()
	sides := []*abSide{{name: "A " + aName}, {name: "B (the tree)"}}
	for i, lib := range []string{aLib, e.lib} {
		n, err := e.newNginx("nginx", filepath.Join(e.dir, fmt.Sprintf("ab%d", i)), "builtin", "")
		if err != nil {
			return err
		}
		n.data["Lib"] = lib
		if i == 0 && *abLua != "" {
			n.data["LuaDir"] = *abLua
		}
		if err := n.start(pl.nginxOpts()); err != nil {
			return err
		}
		defer n.stop()
		sides[i].n = n
		if _, err := n.lua("unary", 1000, 100, 1); err != nil {
			return err
		}
	}
	var goc []callStats
	calls := *abN
	log.Printf("ab: %d rounds of %d calls, A = %s", *abRounds, calls, aName)
	for r := 0; r < *abRounds; r++ {
		order := []*abSide{sides[0], sides[1]}
		if r%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, s := range order {
			u, err := s.n.stats("unary", calls, 100, *abC)()
			if err != nil {
				return err
			}
			i, err := s.n.stats("ipc", calls, 100, *abC)()
			if err != nil {
				return err
			}
			s.unary, s.ipc = append(s.unary, u), append(s.ipc, i)
		}
		kind := "seq"
		if *abC > 1 {
			kind = "par"
		}
		g, err := e.goClient(pl, kind, calls, 100, *abC)
		if err != nil {
			return err
		}
		goc = append(goc, g)
	}
	a, b := sides[0], sides[1]
	gmp := "the library's default GOMAXPROCS"
	if *abGMP != "" {
		gmp = "GOMAXPROCS=" + *abGMP
	}
	where := "pinned to CPU 0"
	if !*abPin {
		where = "unpinned"
	}
	sec := fmt.Sprintf("A/B, %s, %s: the tree (B) vs %s (A), %d interleaved rounds of %d 100 B calls each, %s", where, gmp, aName, *abRounds, calls, abHow())
	per := func(f func(callStats) float64) func(callStats) float64 {
		return func(s callStats) float64 { return f(s) * 1e6 / float64(calls) }
	}
	us, cpu := per(statSecs), per(statCPUSecs)
	csw := func(s callStats) float64 { return statCSW(s) / float64(calls) }
	add := func(name string, ra, rb []callStats, f func(callStats) float64, label string) {
		lo, hi := pairedRange(ra, rb, f)
		t.add(row{section: sec, name: fmt.Sprintf("%s (rounds' ratios %.2f–%.2f)", name, lo, hi),
			subject: fmt.Sprintf("%.1f", medianBy(rb, f)), baseline: fmt.Sprintf("%.1f", medianBy(ra, f)),
			ratio: medianBy(rb, f) / medianBy(ra, f), ratioLabel: label})
	}
	add("unary: µs per call", a.unary, b.unary, us, "time ratio")
	add("unary: worker CPU µs per call", a.unary, b.unary, cpu, "CPU ratio")
	add("unary: context switches per call", a.unary, b.unary, csw, "switch ratio")
	add("IPC echo (the hand-off alone): µs per call", a.ipc, b.ipc, us, "time ratio")
	add("IPC echo: worker CPU µs per call", a.ipc, b.ipc, cpu, "CPU ratio")
	add("IPC echo: context switches per call", a.ipc, b.ipc, csw, "switch ratio")
	for _, s := range sides {
		t.add(row{section: sec, name: s.name + ": unary vs the Go client: time per call", subject: fmtUS(medianBy(s.unary, us)),
			baseline: fmtUS(medianBy(goc, us)), ratio: medianBy(s.unary, us) / medianBy(goc, us), ratioLabel: "time ratio"})
		t.add(cpuRow(sec, s.name+": unary vs the Go client: CPU per call", medianBy(s.unary, cpu), medianBy(goc, cpu)))
	}
	return nil
}

// pairedRange is the smallest and largest ratio b/a of the rounds.
func pairedRange(a, b []callStats, f func(callStats) float64) (float64, float64) {
	var rs []float64
	for i := range a {
		rs = append(rs, f(b[i])/f(a[i]))
	}
	sort.Float64s(rs)
	return rs[0], rs[len(rs)-1]
}

// abHow says how the A/B's calls are made.
func abHow() string {
	if *abC > 1 {
		return fmt.Sprintf("%d at once", *abC)
	}
	return "sequential"
}
