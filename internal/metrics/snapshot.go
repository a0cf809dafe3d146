package metrics

import (
	"bytes"
	"slices"
	"strconv"
	"strings"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// A snapshot is one worker's figures as text, one sample a line:
//
//	c <series> <value>    a counter (histogram buckets, _sum and _count too)
//	g <series> <value>    a gauge
//
// where <series> is the sample exactly as the exposition prints it, label
// values escaped, e.g. qrpc_client_calls_total{method="greet",server="10.0.0.1:8081",result="ok"}.
// Values are cumulative since the worker started.
//
// Aggregation over workers in a lua_shared_dict (done in Lua, once a
// second and at worker exit):
//   - a counter's key is <series>; the worker adds value minus what it
//     added last time (dict:incr, or dict:safe_add for a new key, so that
//     nothing is evicted) and remembers value only when that succeeds,
//     so a failed flush is retried, not lost;
//   - a gauge's key is "g<pid> <series>", written with dict:set and an
//     expiry a few flush intervals long and deleted at worker exit, so
//     the gauges of a worker that is gone stop counting.
//
// Render takes lines "<key> <value>" (the dict's contents, or a snapshot:
// a first word that does not start with "qrpc_" is a tag and is skipped),
// sums samples with the same series and prints the exposition.

// Snapshot returns this registry's figures in the snapshot format, in no
// particular order: Render and the shared dict sort or key them anyway.
func (r *Registry) Snapshot() []byte {
	counters, gauges := r.collect()
	size := 0
	for k := range counters {
		size += len(k) + 24
	}
	for k := range gauges {
		size += len(k) + 24
	}
	var b bytes.Buffer
	b.Grow(size)
	writeLines(&b, "c ", counters)
	writeLines(&b, "g ", gauges)
	return b.Bytes()
}

// Text returns this registry's figures in the Prometheus text format.
func (r *Registry) Text() []byte {
	out, err := Render(r.Snapshot())
	if err != nil {
		// A snapshot is made here, so its lines always parse.
		panic("metrics: own snapshot does not render: " + err.Error())
	}
	return out
}

func writeLines(b *bytes.Buffer, tag string, m map[string]float64) {
	for k, v := range m {
		b.WriteString(tag)
		b.WriteString(k)
		b.WriteByte(' ')
		b.WriteString(formatValue(v))
		b.WriteByte('\n')
	}
}

// collect sums every peer's figures by series. Peers of several pools (or
// servers and methods cut to "other") can share a series.
func (r *Registry) collect() (counters, gauges map[string]float64) {
	// Sized as the last snapshot's: growing a map of thousands of series
	// step by step is most of what a snapshot allocates, and what it
	// allocates decides how many GC cycles a scrape runs in the worker.
	counters = make(map[string]float64, r.sizes[0].Load())
	gauges = make(map[string]float64, r.sizes[1].Load())
	defer func() {
		r.sizes[0].Store(int64(len(counters)))
		r.sizes[1].Store(int64(len(gauges)))
	}()
	var sent, recv uint64
	r.mu.Lock()
	pools := slices.Clone(r.order)
	var peers [][]*Peer
	for _, p := range pools {
		peers = append(peers, slices.Clone(p.list))
	}
	r.mu.Unlock()
	for i, p := range pools {
		for m := range p.throttled {
			if n := p.throttled[m].Load(); n > 0 {
				counters[nameThrottled+`{method="`+escape(p.methodName(m))+`"}`] += float64(n)
			}
		}
		for _, pe := range peers[i] {
			srv := escape(pe.server)
			for m := range pe.series {
				s := pe.series[m].Load()
				if s != nil {
					addSeries(counters, escape(p.methodName(m)), srv, s)
				}
			}
			gauges[nameInflight+`{server="`+srv+`"}`] += float64(pe.inflight.Load())
			for j, name := range stateLabels {
				gauges[nameConnections+`{server="`+srv+`",state="`+name+`"}`] += float64(max(pe.states[j].Load(), 0))
			}
			counters[nameReconnects+`{server="`+srv+`"}`] += float64(pe.reconnects.Load())
			counters[nameEjections+`{server="`+srv+`"}`] += float64(pe.ejections.Load())
			for j := range pe.retries {
				if n := pe.retries[j].Load(); n > 0 {
					reason := results[j]
					if j == resOK {
						reason = "hedge"
					}
					counters[nameRetries+`{server="`+srv+`",reason="`+reason+`"}`] += float64(n)
				}
			}
			if n := pe.budget.Load(); n > 0 {
				counters[nameBudget+`{server="`+srv+`"}`] += float64(n)
			}
			sent += pe.sent.Load()
			recv += pe.recv.Load()
		}
	}
	counters[nameBytes+`{direction="sent"}`] += float64(sent)
	counters[nameBytes+`{direction="received"}`] += float64(recv)
	// The process's recovered panics (internal/safego), one series per
	// kind of goroutine started so far: a fixed set of names in the code.
	for _, c := range safego.Counts() {
		counters[namePanics+`{where="`+escape(c.Where)+`"}`] += float64(c.N)
	}
	if f := r.extra.Load(); f != nil {
		(*f)(func(series string, v float64) { counters[series] += v })
	}
	return counters, gauges
}

// addSeries adds the samples of one (method, server). Calls and the
// histogram appear once the method has had a call, events once it has
// had an event; then every result is listed, zeros included, so that
// rate() finds a series for each.
func addSeries(m map[string]float64, method, server string, s *Series) {
	labels := `method="` + method + `",server="` + server + `"`
	// calls_total of results other than ok and the buckets are separate
	// atomics: a snapshot taken while calls finish may see such a call in
	// one and not yet in the other. Both settle as soon as calls stop; a
	// lock would cost every call. Every counter stays monotonic.
	var calls [numResults]uint64
	var cum uint64
	var cumBuckets [numBuckets]uint64
	for i := range cumBuckets {
		ok := s.okBuckets[i].Load()
		calls[resOK] += ok
		cum += ok + s.otherBuckets[i].Load()
		cumBuckets[i] = cum
	}
	var nCalls uint64
	for i := range calls {
		if i != resOK {
			calls[i] = s.calls[i].Load()
		}
		nCalls += calls[i]
	}
	if nCalls > 0 || cum > 0 {
		for i, n := range calls {
			m[nameCalls+"{"+labels+`,result="`+results[i]+`"}`] += float64(n)
		}
		for i, n := range cumBuckets {
			m[nameDuration+"_bucket{"+labels+`,le="`+bucketLabels[i]+`"}`] += float64(n)
		}
		m[nameDuration+"_sum{"+labels+"}"] += float64(s.sumNs.Load()) / 1e9
		m[nameDuration+"_count{"+labels+"}"] += float64(cum)
	}
	sent, dropped := s.events[0].Load(), s.events[1].Load()
	if sent > 0 || dropped > 0 {
		m[nameEvents+"{"+labels+`,result="sent"}`] += float64(sent)
		m[nameEvents+"{"+labels+`,result="dropped"}`] += float64(dropped)
	}
}

// escape escapes a label value for the text format: backslash, double
// quote and line feed.
func escape(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// formatValue prints whole numbers without exponent up to 2^53, others
// in the shortest form that reads back the same.
func formatValue(v float64) string {
	if v == float64(int64(v)) && v < 1<<53 && v > -(1<<53) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
