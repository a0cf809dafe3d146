package bridge

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/metrics"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// Metrics and error messages.
//
// The runtime owns the worker's metrics.Registry. Every connection of the
// table is a qrpc.Pool whose Observer is r.metrics.Pool(key): the pool
// itself reports each server's calls, events, in-flight calls, states,
// ejections, reconnects and frame bytes. A call that fails before any
// server is chosen ("unavailable: no server up") has no server to be
// counted under and is not counted.

func init() {
	RegisterQuery(OpMetrics, func(r *Runtime, cmd *Command) ([]byte, error) {
		out, err := r.MetricsQuery(string(cmd.Method), cmd.Body)
		if err != nil {
			// Unknown what, or a dump that does not parse: the caller's.
			return nil, Badf("%v", err)
		}
		return out, nil
	})
}

// Metrics is the worker's registry.
func (r *Runtime) Metrics() *metrics.Registry { return r.metrics }

// MetricsQuery answers QRPC_OP_METRICS: what is "" (this worker's figures,
// text format), "snapshot" (the same for a shared dict, as records: a
// SAMPLE_SERIES, then its SAMPLE_COUNTER or SAMPLE_GAUGE) or "render" (the
// text format of body, records of SAMPLE_SERIES and SAMPLE_COUNTER: the
// dict's contents). See metrics.Registry.Query.
func (r *Runtime) MetricsQuery(what string, body []byte) ([]byte, error) {
	switch what {
	case "snapshot":
		return snapshotRecords(r.metrics.Snapshot()), nil
	case "render":
		lines, err := renderLines(body)
		if err != nil {
			return nil, err
		}
		return r.metrics.Query("render", lines)
	}
	return r.metrics.Query(what, body)
}

// maxRenderLen bounds a render's records: a dict of many series.
const maxRenderLen = 64 << 20

// snapshotRecords turns the snapshot's lines ("c|g <series> <value>",
// made by internal/metrics) into records.
func snapshotRecords(text []byte) []byte {
	var b []byte
	for len(text) > 0 {
		var line []byte
		line, text, _ = bytes.Cut(text, []byte{'\n'})
		kind, rest, ok := bytes.Cut(line, []byte{' '})
		sp := bytes.LastIndexByte(rest, ' ')
		if !ok || sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(string(rest[sp+1:]), 64)
		if err != nil {
			continue
		}
		key := KeySampleCounter
		if string(kind) == "g" {
			key = KeySampleGauge
		}
		b = AppendStr(b, KeySampleSeries, string(rest[:sp]))
		b = AppendFloat(b, key, v)
	}
	return b
}

// renderLines turns render's records into the "key value" lines
// metrics.Render reads.
func renderLines(body []byte) ([]byte, error) {
	var out []byte
	series := ""
	err := eachRecMax(body, maxRenderLen, func(rec Rec) error {
		switch rec.Key {
		case KeySampleSeries:
			series = rec.Str()
		case KeySampleCounter, KeySampleGauge:
			if series == "" || strings.ContainsAny(series, "\n") {
				return Badf("metrics: a value without its series")
			}
			out = append(out, series...)
			out = append(out, ' ')
			out = strconv.AppendFloat(out, rec.Float(), 'g', 17, 64)
			out = append(out, '\n')
			series = ""
		default:
			return Badf("metrics: record %d in a render", rec.Key)
		}
		return nil
	})
	return out, err
}

// reasonFields splits an error with a word and a reason (qrpc.Classify)
// into what a caller compares, "word: reason", and the detail.
func reasonFields(err error) (string, string) {
	rs := qrpc.Classify(err)
	detail := rs.Detail
	rs.Detail = ""
	return rs.String(), detail
}
