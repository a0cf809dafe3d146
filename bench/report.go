package main

// The report: rows collected by the sections, printed as one markdown
// table (and drawn by chart.go).

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

type row struct {
	section, name     string
	subject, baseline string // formatted values
	ratio             float64
	noRatio           bool // a reading with nothing to compare it with (printed "—", not charted)
	ratioLabel        string
	target            string // "≥ 1.5", "≤ 0.7", "≈ 0"; "" = none
	met               bool
}

type table struct {
	header  string // the first line, when kept from an earlier report (-merge)
	machine string
	steal   float64 // fraction of CPU time stolen by the hypervisor during the run
	rows    []row
	notes   []string
}

func (t *table) add(r row) { t.rows = append(t.rows, r) }

// sections groups the rows by section, in the order sections first appear.
func (t *table) sections() [][]row {
	var out [][]row
	at := map[string]int{}
	for _, r := range t.rows {
		i, ok := at[r.section]
		if !ok {
			i = len(out)
			at[r.section] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], r)
	}
	return out
}

func (t *table) note(format string, args ...any) {
	t.notes = append(t.notes, fmt.Sprintf(format, args...))
}

// withTarget sets the target of r and whether its ratio meets it.
func (r row) withTarget(target string) row {
	r.target = target
	v, op := targetValue(target)
	switch op {
	case "≥":
		r.met = r.ratio >= v
	case "≤":
		r.met = r.ratio <= v
	}
	return r
}

// ratioText is the ratio with two decimals, or with as many more (up to
// four) as it takes to tell it from its target: 1.997 against "≥ 2"
// must not print as "2.00".
func (r row) ratioText() string {
	s := fmt.Sprintf("%.2f", r.ratio)
	if r.target == "" {
		return s
	}
	v, _ := targetValue(r.target)
	for digits := 3; digits <= 4 && r.ratio != v && s == fmt.Sprintf("%.*f", digits-1, v); digits++ {
		s = fmt.Sprintf("%.*f", digits, r.ratio)
	}
	return s
}

// targetValue parses "≥ 1.5" into 1.5 and "≥".
func targetValue(target string) (float64, string) {
	op, num, ok := strings.Cut(target, " ")
	if !ok {
		return 0, ""
	}
	var v float64
	if _, err := fmt.Sscanf(num, "%g", &v); err != nil {
		return 0, ""
	}
	return v, op
}

// timeRow compares the time of the same calls: subject's over baseline's.
func timeRow(sec, name string, subject, baseline time.Duration) row {
	return row{section: sec, name: name, subject: fmtDur(subject), baseline: fmtDur(baseline),
		ratio: subject.Seconds() / baseline.Seconds(), ratioLabel: "time ratio"}
}

// rateRow compares the throughput of the same calls: baseline's time over
// subject's.
func rateRow(sec, name string, calls int, subject, baseline time.Duration) row {
	return row{section: sec, name: name, subject: fmtRate(calls, subject), baseline: fmtRate(calls, baseline),
		ratio: baseline.Seconds() / subject.Seconds(), ratioLabel: "throughput ratio"}
}

func fmtDur(d time.Duration) string { return fmt.Sprintf("%.3f s", d.Seconds()) }
func fmtRate(calls int, d time.Duration) string {
	return fmt.Sprintf("%.0f calls/s", float64(calls)/d.Seconds())
}

func sizeName(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%d KB", n/1024)
	}
	if n >= 1000 {
		return fmt.Sprintf("%.0f KB", float64(n)/1024)
	}
	return fmt.Sprintf("%d B", n)
}

func machine(nginxBin string) string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				model = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	nv, _ := exec.Command(nginxBin, "-v").CombinedOutput()
	return fmt.Sprintf("%d vCPU %s, %s, %s, %s", runtime.NumCPU(), model, runtime.Version(), strings.TrimSpace(string(nv)), time.Now().UTC().Format("2006-01-02"))
}

func (r row) markdown() string {
	target := ""
	if r.target != "" {
		mark := "missed"
		if r.met {
			mark = "met"
		}
		target = fmt.Sprintf("%s (%s)", r.target, mark)
	}
	ratio := r.ratioText() + " " + r.ratioLabel
	if r.noRatio {
		ratio = "—"
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s |\n", r.name, r.subject, r.baseline, ratio, target)
}

func (t *table) markdown(p params) string {
	var b strings.Builder
	mode := "full"
	if p.quick {
		mode = "quick (BENCH_QUICK=1)"
	}
	if t.header != "" {
		b.WriteString(t.header + "\n\n")
	} else {
		fmt.Fprintf(&b, "Machine: %s. Mode: %s; medians of %d run(s). CPU steal during the run: %.1f%%.\n\n", t.machine, mode, p.runs, 100*t.steal)
	}
	b.WriteString("| figure | lua-resty-ffi-qrpc | baseline | ratio | target |\n|---|---|---|---|---|\n")
	for _, rows := range t.sections() {
		fmt.Fprintf(&b, "| **%s** | | | | |\n", rows[0].section)
		for _, r := range rows {
			b.WriteString(r.markdown())
		}
	}
	b.WriteString("\nBaselines: IPC = the same Lua loop over a cosocket to a Go unix-socket echo server; unary = the plain Go qrpc client making the same calls to the same server, in its own process placed on the CPUs like the nginx worker (the server is a third process); HTTP = the same nginx doing proxy_pass to a Go HTTP/1.1 keepalive upstream; sidecar = the same nginx doing proxy_pass (keepalive) to a Go HTTP/1.1 service that makes the same qrpc call with the Go client, to the same server (the sidecar runs with Go's default GOMAXPROCS; pinned, it shares CPU 0 with the nginx worker); GOMAXPROCS = the library's default (1 P) with the same number of workers; lua-resty-ffi = the same nginx binary (rebuilt for lua-resty-ffi) running lua-resty-ffi's own Go echo example, and this module with host = \"resty_ffi\"; protobuf = the same echo calls carrying demo.Profile's protobuf bytes (table mode: table, bytes and the comparison modes (JSON text both ways, one side typed) interleaved in blocks of 50 calls in one light thread, the order rotating each round and reversed every other round; 20 light threads: table and bytes alternating in rounds of 20 calls per thread; gateway: a location posting and answering those bytes); metrics recording = the same sequential calls on a second connection to the same server dialled with configure{ metrics = false } (no observer), interleaved in blocks of 50 in one light thread.\n")
	for _, n := range t.notes {
		fmt.Fprintf(&b, "\n%s\n", n)
	}
	return b.String()
}
