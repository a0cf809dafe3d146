package main

// Metrics recording, whose target is to change sequential calls/s
// through nginx by less than 3 %. The same sequential echo calls from one light
// thread on connections to the same server, one recorded and one dialled
// with configure{ metrics = false } (a pool with a no-op observer: no
// recording at all), and a second recorded one as an A/A control (what
// two connections differ by with nothing between them), interleaved in
// blocks of 50 calls taken in every order in turn
// (bench/lua/bench_metrics.lua), over several runs.
// Each run's ratio pairs the two modes under the same machine load; the
// figures are the medians over runs, and the range of the runs' ratios is
// printed beside them, because a 3 % effect is within a shared machine's
// noise for a single run.

import (
	"encoding/json"
	"fmt"
	"log"
	"path/filepath"
	"sort"
)

const (
	secMetrics    = "Metrics recording: on vs off (configure{ metrics = false }), sequential calls, interleaved in blocks of 50"
	metricsTarget = "≥ 0.97" // less than 3 % fewer calls/s with recording on
)

type metricsMode struct {
	Secs float64 `json:"secs"`
	CPU  float64 `json:"cpu"`
}

// metricsRun is one answer of GET /bench/metrics.
type metricsRun struct {
	Calls    int         `json:"calls"`
	Errors   int         `json:"errors"`
	Recorded int         `json:"recorded"`
	On       metricsMode `json:"on"`
	Off      metricsMode `json:"off"`
	On2      metricsMode `json:"on2"` // the A/A control: recorded too
}

func (r metricsRun) onRate() float64  { return float64(r.Calls) / r.On.Secs }
func (r metricsRun) offRate() float64 { return float64(r.Calls) / r.Off.Secs }
func (r metricsRun) rateRatio() float64 {
	return r.onRate() / r.offRate()
}
func (r metricsRun) onCPU() float64    { return r.On.CPU / float64(r.Calls) * 1e6 }
func (r metricsRun) offCPU() float64   { return r.Off.CPU / float64(r.Calls) * 1e6 }
func (r metricsRun) cpuRatio() float64 { return r.onCPU() / r.offCPU() }
func (r metricsRun) cpuAdded() float64 { return r.onCPU() - r.offCPU() }

// The A/A control: two recorded connections, "on" over "on2".
func (r metricsRun) on2Rate() float64      { return float64(r.Calls) / r.On2.Secs }
func (r metricsRun) controlRatio() float64 { return r.On2.Secs / r.On.Secs }
func (r metricsRun) on2CPU() float64       { return r.On2.CPU / float64(r.Calls) * 1e6 }
func (r metricsRun) controlCPU() float64   { return r.onCPU() / r.on2CPU() }

func (n *nginx) metricsRun(calls int) (metricsRun, error) {
	var r metricsRun
	body, err := n.get(fmt.Sprintf("/bench/metrics?n=%d&size=100&block=50", calls))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return r, fmt.Errorf("bad /bench/metrics answer %q: %w", body, err)
	}
	if r.Errors > 0 || r.Calls == 0 {
		return r, fmt.Errorf("/bench/metrics: %d of %d calls failed; error.log:\n%s", r.Errors, 2*r.Calls, tail(filepath.Join(n.dir, "error.log")))
	}
	// The comparison is only what it says if the "on" calls, and they
	// alone, were recorded.
	if r.Recorded != 2*r.Calls {
		return r, fmt.Errorf("/bench/metrics: the metrics recorded %d calls, want the %d calls made with recording on (and none of the %d made with it off)", r.Recorded, 2*r.Calls, r.Calls)
	}
	return r, nil
}

// ratioRange is "lo–hi" of f over the runs.
func ratioRange(runs []metricsRun, f func(metricsRun) float64, format string) string {
	v := values(runs, f)
	sort.Float64s(v)
	return fmt.Sprintf(format+"–"+format, v[0], v[len(v)-1])
}

func figureMetricsCost(e *env, p params, t *table) error {
	var runs []metricsRun
	nruns := max(p.metricsRuns, p.runs)
	for i := 0; i < nruns; i++ {
		log.Printf("metrics: %d sequential calls per mode, run %d of %d", p.metricsN, i+1, nruns)
		r, err := e.nginx.metricsRun(p.metricsN)
		if err != nil {
			return err
		}
		log.Printf("metrics: on %.0f calls/s %.1f µs CPU, off %.0f calls/s %.1f µs CPU: ratio %.3f; control on2 %.0f calls/s %.1f µs CPU: on/on2 %.3f",
			r.onRate(), r.onCPU(), r.offRate(), r.offCPU(), r.rateRatio(), r.on2Rate(), r.on2CPU(), r.controlRatio())
		runs = append(runs, r)
	}
	name := fmt.Sprintf("100 B, %d calls per mode × %d runs", p.metricsN, len(runs))
	on, off := medianBy(runs, metricsRun.onRate), medianBy(runs, metricsRun.offRate)
	t.add(row{section: secMetrics,
		name:    fmt.Sprintf("%s: calls/s (runs' ratios %s)", name, ratioRange(runs, metricsRun.rateRatio, "%.3f")),
		subject: fmt.Sprintf("%.0f calls/s", on), baseline: fmt.Sprintf("%.0f calls/s", off),
		ratio: medianBy(runs, metricsRun.rateRatio), ratioLabel: "throughput ratio"}.withTarget(metricsTarget))
	cr := cpuRow(secMetrics, fmt.Sprintf("%s: worker CPU per call, all its threads (runs' ratios %s)", name, ratioRange(runs, metricsRun.cpuRatio, "%.3f")),
		medianBy(runs, metricsRun.onCPU), medianBy(runs, metricsRun.offCPU))
	cr.ratio = medianBy(runs, metricsRun.cpuRatio)
	t.add(cr)
	ctl := row{section: secMetrics,
		name:    fmt.Sprintf("A/A control, both recorded: calls/s (runs' ratios %s)", ratioRange(runs, metricsRun.controlRatio, "%.3f")),
		subject: fmt.Sprintf("%.0f calls/s", on), baseline: fmt.Sprintf("%.0f calls/s", medianBy(runs, metricsRun.on2Rate)),
		ratio: medianBy(runs, metricsRun.controlRatio), ratioLabel: "throughput ratio"}
	t.add(ctl)
	cc := cpuRow(secMetrics, fmt.Sprintf("A/A control: worker CPU per call (runs' ratios %s)", ratioRange(runs, metricsRun.controlCPU, "%.3f")),
		medianBy(runs, metricsRun.onCPU), medianBy(runs, metricsRun.on2CPU))
	cc.ratio = medianBy(runs, metricsRun.controlCPU)
	t.add(cc)
	added := medianBy(runs, metricsRun.cpuAdded)
	// In µs, not a ratio: in the table only (the chart's axis is ratios).
	t.add(row{section: secMetrics, name: fmt.Sprintf("worker CPU added per call by recording (runs: %s µs)", ratioRange(runs, metricsRun.cpuAdded, "%.1f")),
		subject: fmtUS(added), baseline: "—", ratio: added, noRatio: true})
	return nil
}
