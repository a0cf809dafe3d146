package main

// The Go baseline client, a child process (-client addr). It runs in its
// own process, started with the same CPU placement and GOMAXPROCS
// environment as the nginx worker it is compared with, so that both sides
// pay the same cross-CPU wake-ups.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
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
	c, err := dial(addr, caFile)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := goSeq(c, min(calls/10+1, warmupMax), size); err != nil {
		return err
	}
	var d time.Duration
	switch kind {
	case "seq":
		d, err = goSeq(c, calls, size)
	case "par":
		d, err = goPar(c, calls, size, workers)
	default:
		err = fmt.Errorf("unknown -kind %q", kind)
	}
	if err != nil {
		return err
	}
	fmt.Printf("SECS %.9f\n", d.Seconds())
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

// goMeasure is goClient as a figure for pair.
func (e *env) goMeasure(pl placement, kind string, calls, size, workers int) func() (time.Duration, error) {
	return func() (time.Duration, error) { return e.goClient(pl, kind, calls, size, workers) }
}

// goClient runs the baseline client in a child process placed like pl.
func (e *env) goClient(pl placement, kind string, calls, size, workers int) (time.Duration, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
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
	} else {
		cmd.Env = withoutEnv(cmd.Env, "GOMAXPROCS")
	}
	return timedChild("go client", cmd)
}

// timedChild runs one of this binary's internal modes and reads the time
// it measured ("SECS x", printed by the child).
func timedChild(what string, cmd *exec.Cmd) (time.Duration, error) {
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	var secs float64
	if _, err := fmt.Sscanf(string(out), "SECS %g", &secs); err != nil {
		return 0, fmt.Errorf("%s answered %q: %w", what, out, err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}
