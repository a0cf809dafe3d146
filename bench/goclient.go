package main

// The Go baseline client, a child process (-client addr). It runs in its
// own process, started with the same CPU placement and GOMAXPROCS
// environment as the nginx worker it is compared with, so that both sides
// pay the same cross-CPU wake-ups.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/qrpc"
)

// warmupMax caps the warm-up calls before a timed loop (bench.lua has the
// same cap): a sequential warm-up of a tenth of a large concurrent run
// took longer than the run itself.
const warmupMax = 2000

// dial connects the Go client as the Lua side does (the bench CA, SNI
// localhost).
func dial(addr, caFile string) (*qrpc.Client, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := qrpc.Dial(ctx, addr, &qrpc.Config{CAPEM: ca, ServerName: "localhost"})
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return c, nil
}

// runClient is the child: dial, warm up, time the loop, print the seconds.
func runClient(addr, caFile, kind string, calls, size, workers int) error {
	if err := dieWithParent(); err != nil {
		return err
	}
	c, err := dial(addr, caFile)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := goSeq(c, min(calls/10+1, warmupMax), size); err != nil {
		return err
	}
	var ru0, ru1 syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru0); err != nil {
		return err
	}
	var d time.Duration
	picks := -1
	switch kind {
	case "seq":
		d, err = goSeq(c, calls, size)
	case "par":
		d, err = goPar(c, calls, size, workers)
	case "floor-eventfd", "floor-pickup", "floor-pickup-nginx", "floor-export":
		d, picks, err = designFloor(c, calls, size, strings.TrimPrefix(kind, "floor-"))
	default:
		err = fmt.Errorf("unknown -kind %q", kind)
	}
	if err != nil {
		return err
	}
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru1); err != nil {
		return err
	}
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	csw := ru1.Nvcsw + ru1.Nivcsw - ru0.Nvcsw - ru0.Nivcsw
	fmt.Printf("SECS %.9f CPU %.9f CSW %d", d.Seconds(), cpu.Seconds(), csw)
	if picks >= 0 {
		fmt.Printf(" PICKS %d", picks)
	}
	fmt.Println()
	return nil
}

func goSeq(c *qrpc.Client, calls, size int) (time.Duration, error) {
	body := make([]byte, size)
	ctx := context.Background()
	start := time.Now()
	for i := 0; i < calls; i++ {
		resp, err := c.Unary(ctx, "echo", body)
		if err != nil {
			return 0, err
		}
		if len(resp.Body) != size {
			return 0, errors.New("short echo")
		}
	}
	return time.Since(start), nil
}

func goPar(c *qrpc.Client, calls, size, workers int) (time.Duration, error) {
	body := make([]byte, size)
	per := calls / workers
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				if _, err := c.Unary(context.Background(), "echo", body); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// goMeasure is goClient's time as a figure for pair.
func (e *env) goMeasure(pl placement, kind string, calls, size, workers int) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		st, err := e.goClient(pl, kind, calls, size, workers)
		return st.d, err
	}
}

// goStats is goClient as a figure for pairStats.
func (e *env) goStats(pl placement, kind string, calls, size, workers int) func() (callStats, error) {
	return func() (callStats, error) { return e.goClient(pl, kind, calls, size, workers) }
}

// goClient runs the baseline client in a child process placed like pl.
func (e *env) goClient(pl placement, kind string, calls, size, workers int) (callStats, error) {
	self, err := os.Executable()
	if err != nil {
		return callStats{}, err
	}
	args := []string{self, "-client", e.qrpcAddr, "-ca", e.caFile, "-kind", kind,
		"-n", strconv.Itoa(calls), "-size", strconv.Itoa(size), "-c", strconv.Itoa(workers)}
	if pl.pin {
		// taskset before exec: every thread of the child, the Go runtime's
		// first ones included, starts on these CPUs, and Go sizes its
		// default GOMAXPROCS from them, as it does in the nginx worker.
		args = append([]string{"taskset", "-c", "0"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = os.Environ()
	if pl.gomaxprocs != "" {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+pl.gomaxprocs)
	} else if strings.HasPrefix(kind, "floor-") {
		// a floor of the module's design runs with its default, 1 P
		cmd.Env = append(withoutEnv(cmd.Env, "GOMAXPROCS"), "GOMAXPROCS=1")
	} else {
		cmd.Env = withoutEnv(cmd.Env, "GOMAXPROCS")
	}
	return childStats("go client", cmd)
}

// timedChild runs one of this binary's internal modes and reads the time
// it measured ("SECS x", printed by the child).
func timedChild(what string, cmd *exec.Cmd) (time.Duration, error) {
	st, err := childStats(what, cmd)
	return st.d, err
}

// childStats is timedChild with the child's CPU time and context switches
// during the loop, when it prints them ("SECS x CPU y CSW n").
func childStats(what string, cmd *exec.Cmd) (callStats, error) {
	cmd.Stderr = os.Stderr
	out, err := outputBounded(cmd)
	if err != nil {
		return callStats{}, fmt.Errorf("%s: %w", what, err)
	}
	return parseChild(string(out))
}

// childLimit bounds a measuring child, as httpc bounds a request to
// nginx: the Go client calls with no deadline (a timer per call would
// add to the baseline's CPU), so a server that stops answering would
// otherwise hang the bench for good.
var childLimit = 10 * time.Minute

// outputBounded is cmd.Output, with the child's process group killed
// once childLimit has passed (a wrapper such as perf record forks the
// child, which a kill of the wrapper alone would leave running).
func outputBounded(cmd *exec.Cmd) ([]byte, error) {
	var out bytes.Buffer
	cmd.Stdout = &out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	// In a group of its own the child no longer hears the terminal's ^C:
	// it dies with the bench instead.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.Bytes(), err
	case <-time.After(childLimit):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return out.Bytes(), fmt.Errorf("killed after %v: no answer (a server that stopped answering?)", childLimit)
	}
}

// dieWithParent has this process killed when its parent ends. Under a
// wrapper (perf record) the measuring client is the bench's grandchild:
// the bench's Pdeathsig (outputBounded) kills only the wrapper, and in a
// process group of its own the client does not hear the terminal's ^C
// either, so it would go on calling, with no deadline, after the bench
// is gone.
func dieWithParent() error {
	parent := os.Getppid()
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0); e != 0 {
		return fmt.Errorf("prctl(PR_SET_PDEATHSIG): %w", e)
	}
	if os.Getppid() != parent {
		return errors.New("the parent ended before the child started")
	}
	return nil
}

// parseChild reads a child's answer line.
func parseChild(out string) (callStats, error) {
	var st callStats
	f := strings.Fields(out)
	if len(f) < 2 || f[0] != "SECS" {
		return st, fmt.Errorf("child answered %q, want SECS x [CPU y CSW n [PICKS k]]", out)
	}
	for i := 0; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i+1], 64)
		if err != nil {
			return st, fmt.Errorf("child answered %q: bad %s: %w", out, f[i], err)
		}
		switch f[i] {
		case "SECS":
			st.d = secs(v)
		case "CPU":
			st.cpu = secs(v)
		case "CSW":
			st.csw = int64(v)
		case "PICKS":
			st.picks = int64(v)
		default:
			return st, fmt.Errorf("child answered %q: unknown %s", out, f[i])
		}
	}
	return st, nil
}
