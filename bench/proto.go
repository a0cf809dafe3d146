package main

// Protobuf transcoding: what a ten-field message (demo.Profile)
// costs as a Lua table in and out (opts.request/opts.response) over the
// same echo call carrying its protobuf bytes, sequential calls from one
// light thread (bench/lua/bench_proto.lua); and the JSON gateway (JSON in,
// protobuf over qrpc, JSON out) under wrk against the same location
// passing protobuf bytes through. The server is the bench's own echo: it
// returns the request's bytes, so both modes cost the server the same.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/demo/proto/demopb"
)

const (
	secProto      = "Protobuf: demo.Profile (10 fields) as a Lua table in and out vs raw protobuf bytes (sequential calls, 1 light thread)"
	secProtoGW    = "Protobuf: JSON gateway (JSON → protobuf → qrpc → JSON) vs raw protobuf bytes in and out (wrk -t2 -c50, 1 worker)"
	secProtoAdded = "Protobuf: cost transcoding adds per call, demo.Profile (target ≤ 10 µs)"
	protoTarget   = "≤ 10"
)

// benchProfile is the message of the section: the values of
// internal/transcode's Profile benchmarks, so that their figures and these
// describe the same message.
func benchProfile() *demopb.Profile {
	return &demopb.Profile{
		Id: 1234567890123, Name: "Ada Lovelace", Email: "ada@example.com", Age: 36, Active: true,
		Score: 98.25, Tags: []string{"math", "engines", "poetry"}, Color: demopb.Color_COLOR_GREEN,
		Avatar:  []byte("\x89PNG\r\n\x1a\n0123456789abcdef"),
		Created: timestamppb.New(time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)),
	}
}

// profileData is the message in both forms: compact proto3 JSON (what the
// gateway is sent, and what Lua decodes into its table) and protobuf.
func profileData() (js, pb []byte, err error) {
	m := benchProfile()
	raw, err := protojson.Marshal(m)
	if err != nil {
		return nil, nil, fmt.Errorf("profile to JSON: %w", err)
	}
	// protojson varies its whitespace on purpose; the body wrk sends
	// should not.
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, nil, fmt.Errorf("compact profile JSON: %w", err)
	}
	if pb, err = proto.Marshal(m); err != nil {
		return nil, nil, fmt.Errorf("profile to protobuf: %w", err)
	}
	return b.Bytes(), pb, nil
}

// luaQuote is s as a Lua string literal that both LuaJIT and wrk's Lua
// read back byte for byte: printable ASCII as is, the rest as \ddd.
func luaQuote(s []byte) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range s {
		if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "\\%03d", c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// writeProfileFiles writes the Lua module bench_profile.lua (read by
// bench_proto.lua) and the two wrk scripts posting the message, and
// returns the scripts' paths.
func writeProfileFiles(dir string) (jsonScript, pbScript string, err error) {
	js, pb, err := profileData()
	if err != nil {
		return "", "", err
	}
	mod := fmt.Sprintf("-- written by bench/proto.go\nreturn { json = %s, pb = %s }\n", luaQuote(js), luaQuote(pb))
	if err := os.WriteFile(filepath.Join(dir, "bench_profile.lua"), []byte(mod), 0o644); err != nil {
		return "", "", err
	}
	script := func(name, ctype string, body []byte) (string, error) {
		p := filepath.Join(dir, name)
		s := fmt.Sprintf("wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = %q\nwrk.body = %s\n", ctype, luaQuote(body))
		return p, os.WriteFile(p, []byte(s), 0o644)
	}
	if jsonScript, err = script("wrk_profile_json.lua", "application/json", js); err != nil {
		return "", "", err
	}
	if pbScript, err = script("wrk_profile_pb.lua", "application/x-protobuf", pb); err != nil {
		return "", "", err
	}
	return jsonScript, pbScript, nil
}

// protoMode is the calls of one mode in a protoRun, in seconds: wall
// time, CPU time of the worker process (all its threads) and of its nginx
// thread alone (Lua, the module, and the Go code its cgo calls run).
type protoMode struct {
	Secs      float64 `json:"secs"`
	CPU       float64 `json:"cpu"`
	ThreadCPU float64 `json:"thread_cpu"`
	// the worker process's context switches (getrusage), all threads
	CtxSwitches float64 `json:"ctx_switches"`
}

// protoRun is one answer of GET /bench/proto.
type protoRun struct {
	Calls  int       `json:"calls"`
	Errors int       `json:"errors"`
	Table  protoMode `json:"table"`
	Bytes  protoMode `json:"bytes"`
	// JSON text in and out (json = true): Go's transcoding without Lua's
	// table work, to split table mode's added cost between the two
	JSON protoMode `json:"json"`
	// one side typed: a table request with a bytes answer, and bytes
	// with a table answer
	ReqOnly  protoMode `json:"req_only"`
	RespOnly protoMode `json:"resp_only"`
}

// Per call, in µs, for medianBy.
func (r protoRun) us(s float64) float64   { return s / float64(r.Calls) * 1e6 }
func (r protoRun) tableUS() float64       { return r.us(r.Table.Secs) }
func (r protoRun) bytesUS() float64       { return r.us(r.Bytes.Secs) }
func (r protoRun) tableCPUUS() float64    { return r.us(r.Table.CPU) }
func (r protoRun) bytesCPUUS() float64    { return r.us(r.Bytes.CPU) }
func (r protoRun) tableThreadUS() float64 { return r.us(r.Table.ThreadCPU) }
func (r protoRun) bytesThreadUS() float64 { return r.us(r.Bytes.ThreadCPU) }
func (r protoRun) jsonUS() float64        { return r.us(r.JSON.Secs) }
func (r protoRun) jsonCPUUS() float64     { return r.us(r.JSON.CPU) }
func (r protoRun) jsonThreadUS() float64  { return r.us(r.JSON.ThreadCPU) }
func (r protoRun) reqUS() float64         { return r.us(r.ReqOnly.Secs) }
func (r protoRun) reqCPUUS() float64      { return r.us(r.ReqOnly.CPU) }
func (r protoRun) reqThreadUS() float64   { return r.us(r.ReqOnly.ThreadCPU) }
func (r protoRun) respUS() float64        { return r.us(r.RespOnly.Secs) }
func (r protoRun) respCPUUS() float64     { return r.us(r.RespOnly.CPU) }
func (r protoRun) respThreadUS() float64  { return r.us(r.RespOnly.ThreadCPU) }
func (r protoRun) tableCsw() float64      { return r.Table.CtxSwitches / float64(r.Calls) }
func (r protoRun) bytesCsw() float64      { return r.Bytes.CtxSwitches / float64(r.Calls) }
func (r protoRun) jsonCsw() float64       { return r.JSON.CtxSwitches / float64(r.Calls) }

func (n *nginx) protoRun(calls int) (protoRun, error) {
	var r protoRun
	body, err := n.get(fmt.Sprintf("/bench/proto?n=%d", calls))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return r, fmt.Errorf("bad /bench/proto answer %q: %w", body, err)
	}
	if r.Errors > 0 || r.Calls == 0 {
		return r, fmt.Errorf("/bench/proto: %d of %d calls failed; error.log:\n%s", r.Errors, 2*r.Calls, tail(filepath.Join(n.dir, "error.log")))
	}
	return r, nil
}

// protoParRun is one answer of GET /bench/proto_par: the same modes with
// calls in flight from many light threads.
type protoParRun struct {
	Calls  int       `json:"calls"`
	Errors int       `json:"errors"`
	Table  protoMode `json:"table"`
	Bytes  protoMode `json:"bytes"`
}

func (r protoParRun) us(s float64) float64 { return s / float64(r.Calls) * 1e6 }
func (r protoParRun) tableCPUUS() float64  { return r.us(r.Table.CPU) }
func (r protoParRun) bytesCPUUS() float64  { return r.us(r.Bytes.CPU) }
func (r protoParRun) tableRate() float64   { return float64(r.Calls) / r.Table.Secs }
func (r protoParRun) bytesRate() float64   { return float64(r.Calls) / r.Bytes.Secs }

func (n *nginx) protoParRun(calls, conc int) (protoParRun, error) {
	var r protoParRun
	body, err := n.get(fmt.Sprintf("/bench/proto_par?n=%d&c=%d", calls, conc))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return r, fmt.Errorf("bad /bench/proto_par answer %q: %w", body, err)
	}
	if r.Errors > 0 || r.Calls == 0 {
		return r, fmt.Errorf("/bench/proto_par: %d of %d calls failed; error.log:\n%s", r.Errors, 2*r.Calls, tail(filepath.Join(n.dir, "error.log")))
	}
	return r, nil
}

// addedRow is a cost transcoding adds per call: the median over runs of
// the paired difference subject − baseline, in µs, against the target.
func addedRow(name string, subject, baseline []float64) row {
	d := make([]float64, len(subject))
	for i := range subject {
		d[i] = subject[i] - baseline[i]
	}
	added := medianBy(d, func(v float64) float64 { return v })
	if len(d) > 1 {
		lo, hi := d[0], d[0]
		for _, v := range d {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
		name += fmt.Sprintf(" (runs %.1f–%.1f)", lo, hi)
	}
	return row{section: secProtoAdded, name: name, subject: fmtUS(added), baseline: "—",
		ratio: added, ratioLabel: "µs added"}.withTarget(protoTarget)
}

func figureProto(e *env, p params, t *table) error {
	jsonScript, pbScript, err := writeProfileFiles(e.dir)
	if err != nil {
		return err
	}
	var runs []protoRun
	for i := 0; i < max(p.pbRuns, p.runs); i++ {
		log.Printf("proto: %d sequential calls per mode, run %d", p.pbSeqN, i+1)
		r, err := e.nginx.protoRun(p.pbSeqN)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	tw, bw := medianBy(runs, protoRun.tableUS), medianBy(runs, protoRun.bytesUS)
	t.add(row{section: secProto, name: fmt.Sprintf("%d calls each, interleaved, median of %d runs: time per call", p.pbSeqN, len(runs)),
		subject: fmtUS(tw), baseline: fmtUS(bw), ratio: tw / bw, ratioLabel: "time ratio"})
	tc, bc := medianBy(runs, protoRun.tableCPUUS), medianBy(runs, protoRun.bytesCPUUS)
	t.add(cpuRow(secProto, "worker CPU per call (all its threads, Go's included)", tc, bc))
	th, bh := medianBy(runs, protoRun.tableThreadUS), medianBy(runs, protoRun.bytesThreadUS)
	t.add(cpuRow(secProto, "nginx thread CPU per call (Lua, the module, Go inside its cgo calls)", th, bh))
	t.add(addedRow("table in/out: time added per call", values(runs, protoRun.tableUS), values(runs, protoRun.bytesUS)))
	t.add(addedRow("table in/out: worker CPU added per call", values(runs, protoRun.tableCPUUS), values(runs, protoRun.bytesCPUUS)))
	t.add(addedRow("table in/out: nginx thread CPU added per call", values(runs, protoRun.tableThreadUS), values(runs, protoRun.bytesThreadUS)))
	// Where table mode's added time goes: the same message as JSON text
	// both ways costs Go the same transcoding and Lua no table work.
	t.add(infoRow("for comparison, JSON in/out (json = true, no Lua table): time added per call", values(runs, protoRun.jsonUS), values(runs, protoRun.bytesUS)))
	t.add(infoRow("for comparison, JSON in/out: worker CPU added per call", values(runs, protoRun.jsonCPUUS), values(runs, protoRun.bytesCPUUS)))
	t.add(infoRow("for comparison, JSON in/out: nginx thread CPU added per call", values(runs, protoRun.jsonThreadUS), values(runs, protoRun.bytesThreadUS)))
	// Which side costs what: only the request typed (a table in, bytes
	// out), only the response (bytes in, a table out).
	t.add(infoRow("request only (table in, bytes out): time added per call", values(runs, protoRun.reqUS), values(runs, protoRun.bytesUS)))
	t.add(infoRow("request only: worker CPU added per call", values(runs, protoRun.reqCPUUS), values(runs, protoRun.bytesCPUUS)))
	t.add(infoRow("request only: nginx thread CPU added per call", values(runs, protoRun.reqThreadUS), values(runs, protoRun.bytesThreadUS)))
	t.add(infoRow("response only (bytes in, table out): time added per call", values(runs, protoRun.respUS), values(runs, protoRun.bytesUS)))
	t.add(infoRow("response only: worker CPU added per call", values(runs, protoRun.respCPUUS), values(runs, protoRun.bytesCPUUS)))
	t.add(infoRow("response only: nginx thread CPU added per call", values(runs, protoRun.respThreadUS), values(runs, protoRun.bytesThreadUS)))
	tw2, bw2, jw2 := medianBy(runs, protoRun.tableCsw), medianBy(runs, protoRun.bytesCsw), medianBy(runs, protoRun.jsonCsw)
	csw := func(f func(protoRun) protoMode) float64 {
		return medianBy(runs, func(r protoRun) float64 { return f(r).CtxSwitches / float64(r.Calls) })
	}
	qw2 := csw(func(r protoRun) protoMode { return r.ReqOnly })
	pw2 := csw(func(r protoRun) protoMode { return r.RespOnly })
	t.add(row{section: secProto, name: fmt.Sprintf("worker context switches per call (JSON in/out: %.2f; request only: %.2f; response only: %.2f)", jw2, qw2, pw2),
		subject: fmt.Sprintf("%.2f", tw2), baseline: fmt.Sprintf("%.2f", bw2), ratio: tw2 / bw2, ratioLabel: "ratio"})

	// Sequential calls leave the worker's threads idle between calls, and
	// Go's wake-ups and spinning then make most of its CPU per call
	// (perf: over half of it in the kernel switching threads), growing
	// with the call's length rather than with the work. With calls in
	// flight that part is shared: this figure is closer to the work
	// transcoding adds. The sequential figures above stay the target's.
	const parConc = 20
	var par []protoParRun
	for i := 0; i < p.runs; i++ {
		log.Printf("proto: %d calls per mode from %d light threads, run %d", 5*p.pbSeqN, parConc, i+1)
		r, err := e.nginx.protoParRun(5*p.pbSeqN, parConc)
		if err != nil {
			return err
		}
		par = append(par, r)
	}
	t.add(cpuRow(secProto, fmt.Sprintf("%d light threads at once: worker CPU per call (all its threads)", parConc),
		medianBy(par, protoParRun.tableCPUUS), medianBy(par, protoParRun.bytesCPUUS)))
	t.add(infoRow(fmt.Sprintf("table in/out, %d light threads at once: worker CPU added per call", parConc),
		values(par, protoParRun.tableCPUUS), values(par, protoParRun.bytesCPUUS)))
	tr, br := medianBy(par, protoParRun.tableRate), medianBy(par, protoParRun.bytesRate)
	t.add(row{section: secProto, name: fmt.Sprintf("%d light threads at once: calls/s", parConc),
		subject: fmt.Sprintf("%.0f calls/s", tr), baseline: fmt.Sprintf("%.0f calls/s", br), ratio: tr / br, ratioLabel: "throughput ratio"})

	if !haveWrk(t) {
		return nil
	}
	worker, err := e.nginx.workers()
	if err != nil {
		return err
	}
	var js, pbs, rs, rgs, hgs, cs, cgs []wrkResult
	getScript := filepath.Join(e.dir, "wrk_get.lua")
	if err := os.WriteFile(getScript, []byte("wrk.method = \"GET\"\n"), 0o644); err != nil {
		return err
	}
	// load runs wrk on one path; any non-2xx answer fails the figure.
	load := func(path, script string) (wrkResult, error) {
		r, err := wrkScript(e.nginx.port, path, p.pbWrkDur, script, worker)
		if err == nil && r.non2xx > 0 {
			err = fmt.Errorf("%s: %d non-2xx answers; error.log:\n%s", path, r.non2xx, tail(filepath.Join(e.dir, "error.log")))
		}
		return r, err
	}
	const getQuery = "ada?age=36&email=ada%40example.org"
	for i := 0; i < p.runs; i++ {
		log.Printf("proto: JSON gateway, run %d", i+1)
		for _, l := range []struct {
			path, script string
			into         *[]wrkResult
		}{
			{"/gw/proto/json", jsonScript, &js},
			{"/gw/rest/v1/echo", jsonScript, &rs},
			{"/gw/rest/v1/profile/" + getQuery, getScript, &rgs},
			{"/gw/compat/v1/echo", jsonScript, &cs},
			{"/gw/compat/v1/profile/" + getQuery, getScript, &cgs},
			{"/gw/hand/" + getQuery, getScript, &hgs},
			{"/gw/proto/raw", pbScript, &pbs},
		} {
			r, err := load(l.path, l.script)
			if err != nil {
				return err
			}
			*l.into = append(*l.into, r)
		}
	}
	jr, br := medianBy(js, rps), medianBy(pbs, rps)
	t.add(row{section: secProtoGW, name: "requests/s", subject: fmt.Sprintf("%.0f req/s", jr), baseline: fmt.Sprintf("%.0f req/s", br),
		ratio: jr / br, ratioLabel: "throughput ratio"})
	j99, b99 := medianBy(js, p99ms), medianBy(pbs, p99ms)
	t.add(row{section: secProtoGW, name: "p99 latency", subject: fmtMS(j99), baseline: fmtMS(b99), ratio: j99 / b99, ratioLabel: "latency ratio"})
	jc, bcpu := medianBy(js, cpuUS(0)), medianBy(pbs, cpuUS(0))
	t.add(cpuRow(secProtoGW, "CPU per request, nginx worker (all its threads, Go's included)", jc, bcpu))
	t.add(addedRow("JSON gateway: worker CPU added per request", values(js, cpuUS(0)), values(pbs, cpuUS(0))))
	// The REST gateway (route match, Content-Type check, the error shape)
	// over the hand-written JSON location, same body both ways.
	gw := addedRow("REST gateway (resty.ffi.qrpc.gateway, POST route, body \"*\") vs the hand-written JSON location: worker CPU added per request",
		values(rs, cpuUS(0)), values(js, cpuUS(0)))
	t.add(gw.withTarget(restTarget))
	gg := addedRow("REST gateway, GET route with a path parameter and two query parameters (demo.Profile, 10 fields) vs the same written by hand: worker CPU added per request",
		values(rgs, cpuUS(0)), values(hgs, cpuUS(0)))
	t.add(gg.withTarget(restTarget))
	// compat = "grpc-gateway" (header metadata, the body's type, the PATCH
	// mask, form bodies) over the default mode, same routes.
	t.add(addedRow("REST gateway with compat = \"grpc-gateway\" vs the default mode, POST route: worker CPU added per request",
		values(cs, cpuUS(0)), values(rs, cpuUS(0))).withTarget(compatTarget))
	t.add(addedRow("REST gateway with compat = \"grpc-gateway\" vs the default mode, GET route: worker CPU added per request",
		values(cgs, cpuUS(0)), values(rgs, cpuUS(0))).withTarget(compatTarget))
	return nil
}

// compatTarget: what the grpc-gateway preset may add to the default mode.
const compatTarget = "≤ 5"

// restTarget: what the REST gateway may add to a hand-written location.
const restTarget = "≤ 15"

// infoRow is addedRow without a target: a figure that explains another.
func infoRow(name string, subject, baseline []float64) row {
	r := addedRow(name, subject, baseline)
	r.target, r.met = "", false
	return r
}

// values is f of each run, in order (addedRow pairs them by run).
func values[T any](runs []T, f func(T) float64) []float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	return v
}
