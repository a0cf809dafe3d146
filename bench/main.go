// Command bench measures lua-resty-ffi-qrpc side by side with its
// baselines, in one run on one machine, and prints a markdown table
// (also written to -out) and draws it as bar charts (-svg). Run it with
// `make bench` (BENCH_QUICK=1 for a short run). Figures are medians of
// several runs; nothing here passes or fails on time.
//
// One file per section (ipc, unary, http with the sidecar, memory,
// placement, gomaxprocs, restyffi, proto, pools, metricscost, stream,
// idle with idleconf.go and idlesample.go), sharing harness.go and env.go
// (the library build and the servers); the report is report.go and
// chart.go, written where output.go says; the processes the figures call
// are servers.go and goclient.go.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/ngxtest"
)

type params struct {
	quick     bool
	runs      int
	seqN      int // sequential unary calls per run
	parN      int // unary calls per concurrent run
	ipcSeqN   int // sequential IPC calls per run
	ipcParN   int // IPC calls per concurrent run
	conc      int // light threads / goroutines
	wrkDur    string
	gmpWrkDur string // wrk duration of each GOMAXPROCS setting
	memN      int
	sizes     []int
	unSizes   []int
	rfSizes   []int  // IPC echo sizes against lua-resty-ffi
	placeN    int    // sequential calls per run in the placement and lua-resty-ffi figures
	gmpSeqN   int    // sequential calls per run in the GOMAXPROCS figure
	pbSeqN    int    // sequential calls per mode per run in the protobuf figure
	pbRuns    int    // runs of those at least: the figure is a difference of two ~110 µs ones
	pbWrkDur  string // wrk duration of each protobuf gateway location
	poolSeqN  int    // sequential calls per run in the pools figure
	poolParN  int    // concurrent calls per run in the pools figure
	only      map[string]bool
	hold      bool
	holdIdle  bool

	metricsN    int    // sequential calls per mode per run in the metrics figure
	metricsRuns int    // runs of the metrics figure at least (its effect is small)
	merge       bool   // -merge: see merge.go
	out         string // the report's path: the breakdown's flame graphs go beside it

	streamSeqN    int    // sequential calls per subsystem per run in the stream figure
	streamSeqRuns int    // runs of those, each subsystem in turn
	streamRounds  int    // rounds of the stream figure's loads
	streamDur     string // duration of each of those loads
	streamNginx   string // nginx with ngx_stream_lua ("" = the openresty flavour's build)

	main       nginxOpts // of the main nginx
	restyNginx string    // nginx built for lua-resty-ffi ("" = none)
}

// want says whether a figure runs: all by default, those of -only if
// given; the long ones (slow: true) not in quick mode unless named.
func (p params) want(figure string, slow bool) bool {
	if len(p.only) > 0 {
		return p.only[figure]
	}
	return !slow || !p.quick
}

func main() {
	quick := flag.Bool("quick", os.Getenv("BENCH_QUICK") == "1", "short run (under a minute)")
	out := flag.String("out", "", "markdown output file (default "+scratchMD+", or "+committedMD+" with -update)")
	svg := flag.String("svg", "", "chart output file (default beside -out's; \"-\" = none)")
	update := flag.Bool("update", false, "write the committed "+committedMD+" and "+committedSVG+" (a full run only)")
	serve := flag.String("serve", "", "internal: run the echo server with this cert,key pair of files")
	sidecar := flag.String("sidecar", "", "internal: run the HTTP sidecar calling the qrpc server at this address")
	hold := flag.Bool("hold", false, "set up, print the nginx port, and wait (for profiling by hand)")
	holdIdle := flag.Bool("hold-idle", false, "the idle figure keeps its nginx after measuring, until Ctrl-C (for strace/perf by hand)")
	only := flag.String("only", "", "comma-separated figures to run (ipc,unary,http,memory,placement,gomaxprocs,restyffi,proto,pools,balance,metrics,stream,idle,breakdown); default all, in quick mode all but placement, gomaxprocs and breakdown")
	runs := flag.Int("runs", 0, "override: runs per figure (medians are taken)")
	seqN := flag.Int("seqn", 0, "override: sequential unary calls per run")
	parN := flag.Int("parn", 0, "override: unary calls per concurrent run")
	gmp := flag.String("gomaxprocs", "", "GOMAXPROCS of the nginx worker (placement and gomaxprocs figures aside)")
	gdb := flag.String("godebug", "", "GODEBUG of the nginx worker (placement and gomaxprocs figures aside), e.g. "+lazySysmon)
	aff := flag.String("affinity", "", "worker_cpu_affinity of the nginx worker, e.g. 01 (placement and gomaxprocs figures aside)")
	restyNginx := flag.String("resty-nginx", os.Getenv("QRPC_NGINX"), "nginx built for lua-resty-ffi (make nginx-resty-ffi: $QRPC_BUILD_DIR/resty-ffi/sbin/nginx) for the restyffi figure; default $QRPC_NGINX")
	streamNginx := flag.String("stream-nginx", "", "nginx with ngx_stream_lua for the stream figure; default $"+ngxtest.EnvBuildDir+"/openresty/sbin/nginx (make nginx-openresty)")
	client := flag.String("client", "", "internal: run the Go baseline client against this address")
	clientCA := flag.String("ca", "", "internal: CA file for -client and -sidecar")
	clientKind := flag.String("kind", "seq", "internal: -client loop: seq, par, or a design floor (floor-eventfd, floor-pickup, floor-pickup-nginx, floor-export: designfloor.go)")
	clientN := flag.Int("n", 1000, "internal: -client calls")
	clientSize := flag.Int("size", 100, "internal: -client body size")
	clientC := flag.Int("c", 1, "internal: -client goroutines")
	pingpong := flag.Int("pingpong", 0, "internal: time this many same-CPU thread round trips (handoff.go)")
	listeners := flag.Int("listeners", 1, "internal: -serve this many servers (sockets) in the one process")
	merge := flag.Bool("merge", false, "replace only the sections run (-only) in the report already in -out, keep the others, and redraw -svg from the result")
	flag.Parse()
	log.SetFlags(0)
	// Full mode must finish in under 10 minutes on 2 vCPUs; on such a machine a sequential unary call takes 0.3-0.5 ms and
	// a unix socket echo of 100 KB 0.2 ms, hence these counts.
	p := params{quick: *quick, runs: 3, seqN: 20000, parN: 100000, ipcSeqN: 50000, ipcParN: 50000, conc: 100,
		wrkDur: "3s", gmpWrkDur: "2s", memN: 500000, sizes: []int{512, 4096, 102400}, unSizes: []int{100, 4096},
		rfSizes: []int{512, 4096, 102400}, placeN: 3000, gmpSeqN: 2000, pbSeqN: 6000, pbWrkDur: "2s", poolSeqN: 10000, poolParN: 50000,
		metricsN: 5000, metricsRuns: 7, pbRuns: 5, streamSeqN: 2000, streamSeqRuns: 15, streamRounds: 5, streamDur: "2s"}
	if p.quick {
		p = params{quick: true, runs: 1, seqN: 5000, parN: 10000, ipcSeqN: 5000, ipcParN: 10000, conc: 100,
			wrkDur: "2s", gmpWrkDur: "1s", memN: 20000, sizes: []int{512, 102400}, unSizes: []int{100, 4096},
			rfSizes: []int{512, 4096, 102400}, placeN: 1000, gmpSeqN: 500, pbSeqN: 1500, pbWrkDur: "1s", poolSeqN: 1500, poolParN: 5000,
			metricsN: 2000, metricsRuns: 5, pbRuns: 1, streamSeqN: 500, streamSeqRuns: 9, streamRounds: 3, streamDur: "1s"}
	}
	switch {
	case *client != "":
		if err := runClient(*client, *clientCA, *clientKind, *clientN, *clientSize, *clientC); err != nil {
			log.Fatalf("bench client: %v", err)
		}
		return
	case *pingpong > 0:
		if err := runPingPong(*pingpong); err != nil {
			log.Fatalf("bench ping-pong: %v", err)
		}
		return
	case *serve != "":
		if err := serveEcho(*serve, *listeners); err != nil {
			log.Fatalf("bench server: %v", err)
		}
		return
	case *sidecar != "":
		if err := serveSidecar(*sidecar, *clientCA); err != nil {
			log.Fatalf("bench sidecar: %v", err)
		}
		return
	}
	p.hold = *hold
	p.holdIdle = *holdIdle
	if *runs > 0 {
		p.runs = *runs
	}
	if *seqN > 0 {
		p.seqN = *seqN
	}
	if *parN > 0 {
		p.parN = *parN
	}
	p.main = nginxOpts{workers: 1, gomaxprocs: *gmp, godebug: *gdb, affinity: *aff}
	p.restyNginx = *restyNginx
	p.streamNginx = *streamNginx
	p.only = map[string]bool{}
	for _, f := range strings.Split(*only, ",") {
		if f != "" {
			p.only[f] = true
		}
	}
	p.merge = *merge
	mdPath, svgPath, err := outputPaths(*quick, *update, *out, *svg)
	if err != nil {
		log.Fatalf("bench: %v", err)
	}
	log.Printf("bench: results go to %s", mdPath)
	if err := run(p, mdPath, svgPath); err != nil {
		log.Fatalf("bench: %v", err)
	}
}

func run(p params, out, svg string) error {
	p.out = out
	dir, err := os.MkdirTemp("", "qrpc-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o777); err != nil {
		return err
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	e, err := newEnv(root, dir)
	if e != nil {
		defer e.close()
	}
	if err != nil {
		return err
	}
	if e.tmpl, err = template.ParseFiles(filepath.Join(root, "bench", "nginx.conf.tmpl")); err != nil {
		return err
	}
	if e.nginx, err = e.newNginx("nginx", dir, "builtin", ""); err != nil {
		return err
	}
	if err := e.nginx.start(p.main); err != nil {
		return err
	}
	defer e.nginx.stop()
	// Every figure's nginx serves this config: a location of it that no
	// longer runs (a module function renamed) fails the run now, not in
	// the figure that needs it after minutes of others.
	if host, err := e.nginx.get("/host"); err != nil || host != "builtin" {
		return fmt.Errorf("bench nginx: GET /host answered %q (%v), want builtin", host, err)
	}

	if p.hold {
		// the protobuf section's files, for GET /bench/proto by hand
		if _, _, err := writeProfileFiles(dir); err != nil {
			return err
		}
		log.Printf("holding: nginx on 127.0.0.1:%d, prefix %s; GET /bench?kind=unary&n=100&size=100&c=1; Ctrl-C to end", e.nginx.port, dir)
		if lib, why := restyLibDir(p.restyNginx); why == "" {
			// the lua-resty-ffi baseline's pair, for kind=ipc / rfecho by hand
			for _, host := range []string{"builtin", "resty_ffi"} {
				n, err := e.newNginx(p.restyNginx, filepath.Join(dir, "rf-"+host), host, lib)
				if err != nil {
					return err
				}
				if err := n.start(p.main); err != nil {
					return err
				}
				defer n.stop()
				log.Printf("holding: lua-resty-ffi's nginx, host %s, on 127.0.0.1:%d, prefix %s", host, n.port, n.dir)
			}
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		return nil
	}
	var t table
	t.machine = machine("nginx")
	figures := []struct {
		name string
		run  func(*env, params, *table) error
		on   bool
	}{
		{"ipc", figureIPC, p.want("ipc", false)},
		{"unary", figureUnary, p.want("unary", false)},
		{"http", figureHTTP, p.want("http", false)},
		{"memory", figureMemory, p.want("memory", false)},
		{"placement", figurePlacement, p.want("placement", true)},
		{"gomaxprocs", figureGOMAXPROCS, p.want("gomaxprocs", true)},
		{"restyffi", figureRestyFFI, p.want("restyffi", false)},
		{"proto", figureProto, p.want("proto", false)},
		{"pools", figurePools, p.want("pools", false)},
		{"balance", figureBalance, p.want("balance", false)},
		{"metrics", figureMetricsCost, p.want("metrics", false)},
		{"stream", figureStream, p.want("stream", false)},
		{"idle", figureIdle, p.want("idle", false)},
		{"breakdown", figureBreakdown, p.want("breakdown", true)},
		{"ab", figureAB, p.only["ab"]}, // ab.go: only when named
	}
	start, total := time.Now(), readCPUStat()
	for _, f := range figures {
		if !f.on {
			continue
		}
		began, before := time.Now(), readCPUStat()
		if err := f.run(e, p, &t); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
		log.Printf("%s: %.0f s", f.name, time.Since(began).Seconds())
		if st := readCPUStat().stealSince(before); st >= 0.05 {
			t.note("The hypervisor took %.0f%% of the CPU time (steal) during the %s figures: they are less reliable than the others.", 100*st, f.name)
		}
	}
	t.steal = readCPUStat().stealSince(total)
	log.Printf("all figures: %.0f s", time.Since(start).Seconds())
	if p.merge && out != "" {
		old, err := os.ReadFile(out)
		if err != nil {
			return fmt.Errorf("-merge: %w", err)
		}
		if err := t.merge(string(old), p); err != nil {
			return fmt.Errorf("-merge %s: %w", out, err)
		}
	}
	md := t.markdown(p)
	fmt.Print(md)
	if out != "" {
		if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
			return err
		}
		log.Printf("wrote %s", out)
	}
	if svg != "" {
		if err := os.WriteFile(svg, t.svg(p), 0o644); err != nil {
			return err
		}
		log.Printf("wrote %s", svg)
	}
	return nil
}
