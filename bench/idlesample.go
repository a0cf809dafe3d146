package main

// What the idle figure reads of each worker, from outside and from the
// kernel's own accounting: every thread's context switches
// (/proc/<pid>/task/<tid>/status) and the process's memory
// (/proc/<pid>/smaps_rollup), sampled on a fixed period so that any
// window can be cut out afterwards, per worker, around its own call.

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// cswSample is one reading of a process's threads: each thread's
// context switches, voluntary and involuntary (each one a time the
// thread was put back on a CPU: a wake-up from sleep, or the end of a
// preemption).
type cswSample struct {
	at  time.Time
	csw map[int]int64 // by tid
}

// memSample is one reading of smaps_rollup, in KB, and the thread count.
type memSample struct {
	at             time.Time
	rss, pss, priv int
	threads        int
}

// procSeries is what the sampler gathered of one process.
type procSeries struct {
	pid int
	csw []cswSample
	mem []memSample
}

// sampler reads its processes every cswEvery (threads) and memEvery
// (memory) until stop; the series are the sampler's until then.
type sampler struct {
	series map[int]*procSeries
	first  chan struct{} // closed once every process has been read
	stopC  chan struct{}
	done   chan struct{}
}

const (
	// cswEvery bounds what a thread that ends between two readings
	// takes with it uncounted: its switches since the last one.
	cswEvery = 100 * time.Millisecond
	// memEvery: smaps_rollup walks the process's page tables; once a
	// second is enough to pick a reading near any window's edge.
	memEvery = time.Second
)

func startSampler(pids []int) *sampler {
	s := &sampler{series: map[int]*procSeries{}, first: make(chan struct{}), stopC: make(chan struct{}), done: make(chan struct{})}
	for _, pid := range pids {
		s.series[pid] = &procSeries{pid: pid}
	}
	go s.run()
	return s
}

func (s *sampler) run() {
	defer close(s.done)
	t := time.NewTicker(cswEvery)
	defer t.Stop()
	var lastMem time.Time
	for pass := 0; ; pass++ {
		now := time.Now()
		mem := now.Sub(lastMem) >= memEvery
		if mem {
			lastMem = now
		}
		for _, ps := range s.series {
			csw, err := taskSwitches(ps.pid)
			if err != nil {
				continue // the process ended: its series stops
			}
			ps.csw = append(ps.csw, cswSample{at: now, csw: csw})
			if !mem {
				continue
			}
			if m, err := readMem(ps.pid); err == nil {
				m.at, m.threads = now, len(csw)
				ps.mem = append(ps.mem, m)
			}
		}
		if pass == 0 {
			close(s.first)
		}
		select {
		case <-s.stopC:
			return
		case <-t.C:
		}
	}
}

// stop ends the sampling and returns the series.
func (s *sampler) stop() map[int]*procSeries {
	close(s.stopC)
	<-s.done
	return s.series
}

// taskSwitches is each thread's context switches, voluntary and not.
func taskSwitches(pid int) (map[int]int64, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for _, d := range ents {
		tid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, d.Name(), "status"))
		if err != nil {
			continue // the thread ended
		}
		var n int64
		for _, line := range strings.Split(string(b), "\n") {
			for _, k := range []string{"voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"} {
				if v, ok := strings.CutPrefix(line, k); ok {
					c, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					n += c
				}
			}
		}
		out[tid] = n
	}
	return out, nil
}

// readMem reads /proc/pid/smaps_rollup.
func readMem(pid int) (memSample, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return memSample{}, err
	}
	kb := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[2] == "kB" {
			kb[strings.TrimSuffix(f[0], ":")], _ = strconv.Atoi(f[1])
		}
	}
	if _, ok := kb["Pss"]; !ok {
		return memSample{}, fmt.Errorf("smaps_rollup of %d: no Pss", pid)
	}
	return memSample{rss: kb["Rss"], pss: kb["Pss"], priv: kb["Private_Clean"] + kb["Private_Dirty"]}, nil
}

// wakeups counts the context switches of ps's threads from the first
// reading at or after from to the last one at or before to: the
// process's main thread (nginx's) and the others apart. A thread born
// in between counts from 0; one that ended counts up to its last
// reading. secs is the time between the two readings.
func (ps *procSeries) wakeups(from, to time.Time) (main, others int64, secs float64, err error) {
	i := sort.Search(len(ps.csw), func(i int) bool { return !ps.csw[i].at.Before(from) })
	j := sort.Search(len(ps.csw), func(i int) bool { return ps.csw[i].at.After(to) }) - 1
	if i >= len(ps.csw) || j <= i {
		return 0, 0, 0, fmt.Errorf("pid %d: no readings from %s to %s", ps.pid, from.Format("15:04:05.000"), to.Format("15:04:05.000"))
	}
	start, last := ps.csw[i].csw, map[int]int64{}
	for _, s := range ps.csw[i : j+1] {
		for tid, v := range s.csw {
			last[tid] = v
		}
	}
	for tid, v := range last {
		d := v - start[tid]
		if tid == ps.pid {
			main += d
		} else {
			others += d
		}
	}
	return main, others, ps.csw[j].at.Sub(ps.csw[i].at).Seconds(), nil
}

// switchesAt is the context switches of all ps's threads at the last
// reading at or before t, each thread that ended counted up to its last
// reading.
func (ps *procSeries) switchesAt(t time.Time) int64 {
	j := sort.Search(len(ps.csw), func(i int) bool { return ps.csw[i].at.After(t) })
	last := map[int]int64{}
	for _, s := range ps.csw[:j] {
		for tid, v := range s.csw {
			last[tid] = v
		}
	}
	var n int64
	for _, v := range last {
		n += v
	}
	return n
}

// memAt is the first memory reading at or after t (the last one if
// none is).
func (ps *procSeries) memAt(t time.Time) (memSample, error) {
	if len(ps.mem) == 0 {
		return memSample{}, fmt.Errorf("pid %d: no memory reading", ps.pid)
	}
	i := sort.Search(len(ps.mem), func(i int) bool { return !ps.mem[i].at.Before(t) })
	return ps.mem[min(i, len(ps.mem)-1)], nil
}
