package main

// HTTP load with wrk, and the CPU time the processes behind it spend.

import (
	"fmt"
	"log"
	"os/exec"
	"regexp"
	"strconv"
	"time"
)

type wrkResult struct {
	rps      float64
	p50, p99 time.Duration
	non2xx   int
	reqs     int
	cpu      []time.Duration // CPU time of each watched group of processes during the run
	csw      []int64         // context switches of each watched group during the run
}

// cswPerReq is the context switches of the i-th watched group per request.
func (r wrkResult) cswPerReq(i int) float64 {
	if r.reqs == 0 {
		return 0
	}
	return float64(r.csw[i]) / float64(r.reqs)
}

// cpuPerReq is the CPU time of the i-th watched group per request.
func (r wrkResult) cpuPerReq(i int) time.Duration {
	if r.reqs == 0 {
		return 0
	}
	return r.cpu[i] / time.Duration(r.reqs)
}

var (
	reRPS    = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	reLat    = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)\s*$`)
	reNon2xx = regexp.MustCompile(`Non-2xx or 3xx responses:\s+(\d+)`)
	reSockEr = regexp.MustCompile(`Socket errors: .*`)
	reReqs   = regexp.MustCompile(`(\d+) requests in`)
)

// wrk runs one load (wrk -t2 -c50) and measures the CPU time each group
// of processes in watch spends meanwhile.
func wrk(port int, path, dur string, watch ...[]int) (wrkResult, error) {
	return wrkScript(port, path, dur, "", watch...)
}

// wrkScript is wrk with a wrk Lua script (-s) when script is not "".
func wrkScript(port int, path, dur, script string, watch ...[]int) (wrkResult, error) {
	var r wrkResult
	before := make([]time.Duration, len(watch))
	cswBefore := make([]int64, len(watch))
	for i, pids := range watch {
		var err error
		if before[i], err = procCPU(pids...); err != nil {
			return r, err
		}
		if cswBefore[i], err = procCSW(pids...); err != nil {
			return r, err
		}
	}
	args := []string{"-t", "2", "-c", "50", "-d", dur, "--latency"}
	if script != "" {
		args = append(args, "-s", script)
	}
	out, err := exec.Command("wrk", append(args, fmt.Sprintf("http://127.0.0.1:%d%s", port, path))...).CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("wrk: %v: %s", err, out)
	}
	for i, pids := range watch {
		after, err := procCPU(pids...)
		if err != nil {
			return r, err
		}
		r.cpu = append(r.cpu, after-before[i])
		csw, err := procCSW(pids...)
		if err != nil {
			return r, err
		}
		r.csw = append(r.csw, csw-cswBefore[i])
	}
	s := string(out)
	if m := reReqs.FindStringSubmatch(s); m != nil {
		r.reqs, _ = strconv.Atoi(m[1])
	}
	m := reRPS.FindStringSubmatch(s)
	if m == nil {
		return r, fmt.Errorf("wrk output without Requests/sec: %s", s)
	}
	r.rps, _ = strconv.ParseFloat(m[1], 64)
	for _, m := range reLat.FindAllStringSubmatch(s, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[m[3]]
		d := time.Duration(v * float64(unit))
		if m[1] == "50" {
			r.p50 = d
		} else {
			r.p99 = d
		}
	}
	if m := reNon2xx.FindStringSubmatch(s); m != nil {
		r.non2xx, _ = strconv.Atoi(m[1])
	}
	if se := reSockEr.FindString(s); se != "" {
		log.Printf("wrk %s: %s", path, se)
	}
	return r, nil
}

// Readings of wrk results, for medianBy.
func rps(r wrkResult) float64   { return r.rps }
func p50ms(r wrkResult) float64 { return r.p50.Seconds() * 1e3 }
func p99ms(r wrkResult) float64 { return r.p99.Seconds() * 1e3 }

// cswPer reads the context switches per request of the i-th watched group.
func cswPer(i int) func(wrkResult) float64 {
	return func(r wrkResult) float64 { return r.cswPerReq(i) }
}

// cpuUS reads the CPU per request of the i-th watched group, in µs.
func cpuUS(i int) func(wrkResult) float64 {
	return func(r wrkResult) float64 { return r.cpuPerReq(i).Seconds() * 1e6 }
}
