package main

// The harness every section shares: child processes, CPU time and steal
// from /proc, medians, CPU placement (nginx.go and wrk.go are the rest).

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("go.mod not found above " + dir)
}

// freePort is a loopback TCP port free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ---- child processes ----

// child is this binary run in one of its internal modes (a server or the
// sidecar), which prints "ADDR host:port" once it listens and exits when
// its stdin closes: the harness's end, even a crash, stops it.
type child struct {
	addr  string
	pid   int
	stdin io.Closer
	cmd   *exec.Cmd
}

func startChild(args ...string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return startChildOf(self, args...)
}

// startChildOf is startChild with another build of this program.
func startChildOf(bin string, args ...string) (*child, error) {
	cmd := exec.Command(bin, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", args[0], err)
	}
	c := &child{pid: cmd.Process.Pid, stdin: stdin, cmd: cmd}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ADDR ") {
		c.stop()
		return nil, fmt.Errorf("%s process: %q: %v", args[0], line, err)
	}
	c.addr = strings.TrimSpace(strings.TrimPrefix(line, "ADDR "))
	return c, nil
}

func (c *child) stop() { c.stdin.Close(); _ = c.cmd.Wait() }

// untilStdinCloses is the internal modes' lifetime: see child.
func untilStdinCloses(addr string) {
	fmt.Printf("ADDR %s\n", addr)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

func withoutEnv(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// ---- CPU time from /proc ----

// procCPU is the user+system CPU time of every thread of the pids so far.
func procCPU(pids ...int) (time.Duration, error) {
	var sum time.Duration
	for _, pid := range pids {
		d, err := statCPU(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, err
		}
		sum += d
	}
	return sum, nil
}

// threadCPU is the user+system CPU time of one thread of pid so far.
func threadCPU(pid, tid int) (time.Duration, error) {
	return statCPU(fmt.Sprintf("/proc/%d/task/%d/stat", pid, tid))
}

// statCPU reads utime+stime from a stat file of /proc.
func statCPU(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return parseStatCPU(path, string(b))
}

func parseStatCPU(path, s string) (time.Duration, error) {
	// The command name, field 2, may hold spaces: count from its ')'.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: short line", path)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%s: bad utime/stime", path)
	}
	// USER_HZ is 100 on every Linux architecture Go supports for this.
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// procCSW is how many times every thread of the pids so far has been
// switched out, by choice (it waited) or not (preempted): each switch is a
// sleep or a preemption and a wake-up, the costliest steps of a hand-off
// between threads.
func procCSW(pids ...int) (int64, error) {
	var sum int64
	for _, pid := range pids {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return 0, err
		}
		for _, task := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
			if err != nil {
				continue // the thread has ended since the listing
			}
			n, err := ctxtSwitches(string(b))
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/task/%s/status: %w", pid, task.Name(), err)
			}
			sum += n
		}
	}
	return sum, nil
}

// ctxtSwitches adds the two *_ctxt_switches counts of a status file.
func ctxtSwitches(status string) (int64, error) {
	var sum int64
	found := 0
	for _, l := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || (k != "voluntary_ctxt_switches" && k != "nonvoluntary_ctxt_switches") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bad %s: %w", k, err)
		}
		sum += n
		found++
	}
	if found != 2 {
		return 0, errors.New("no voluntary and nonvoluntary_ctxt_switches lines")
	}
	return sum, nil
}

// cpuStat is the first line of /proc/stat: CPU time by state, in ticks.
type cpuStat []uint64

func readCPUStat() cpuStat {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(string(b), "\n")
	var st cpuStat
	for _, f := range strings.Fields(line)[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil
		}
		st = append(st, v)
	}
	return st
}

// stealSince is the fraction of CPU time stolen by the hypervisor since
// an earlier reading (user, nice, system, idle, iowait, irq, softirq,
// steal are the first eight fields), 0 when unknown.
func (st cpuStat) stealSince(old cpuStat) float64 {
	if len(st) < 8 || len(old) < 8 {
		return 0
	}
	var total uint64
	for i := 0; i < 8; i++ {
		total += st[i] - old[i]
	}
	if total == 0 {
		return 0
	}
	return float64(st[7]-old[7]) / float64(total)
}

// ---- medians ----

func median(xs []time.Duration) time.Duration {
	s := append([]time.Duration(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func medianBy[T any](xs []T, f func(T) float64) float64 {
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	sort.Float64s(v)
	return v[len(v)/2]
}

// callStats is one timed loop of calls: how long it took, and the CPU
// time and context switches of the client side's process meanwhile (the
// nginx worker, or the Go client).
type callStats struct {
	d     time.Duration
	cpu   time.Duration
	csw   int64
	picks int64 // a design floor's calls taken by its pickup (designfloor.go)
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// pairStats is pair for figures that report callStats; it returns the
// runs of each side, for medianBy.
func pairStats(runs int, subject, baseline func() (callStats, error)) ([]callStats, []callStats, error) {
	var a, b []callStats
	for i := 0; i < runs; i++ {
		x, err := subject()
		if err != nil {
			return nil, nil, err
		}
		y, err := baseline()
		if err != nil {
			return nil, nil, err
		}
		a, b = append(a, x), append(b, y)
	}
	return a, b, nil
}

// The readings of callStats, for medianBy.
func statSecs(s callStats) float64    { return s.d.Seconds() }
func statCPUSecs(s callStats) float64 { return s.cpu.Seconds() }
func statCSW(s callStats) float64     { return float64(s.csw) }

// pair measures subject and baseline alternately runs times.
func pair(runs int, subject, baseline func() (time.Duration, error)) (time.Duration, time.Duration, error) {
	var a, b []time.Duration
	for i := 0; i < runs; i++ {
		x, err := subject()
		if err != nil {
			return 0, 0, err
		}
		y, err := baseline()
		if err != nil {
			return 0, 0, err
		}
		a, b = append(a, x), append(b, y)
	}
	return median(a), median(b), nil
}

// ---- CPU placement ----

func allCPUs() []int {
	cpus := make([]int, runtime.NumCPU())
	for i := range cpus {
		cpus[i] = i
	}
	return cpus
}

// setAffinity pins every thread of pid to cpus. Threads started later
// inherit the mask of the thread that starts them.
func setAffinity(pid int, cpus []int) error {
	return forThreads(pid, func(tid int) error { return setThreadAffinity(tid, cpus) })
}

// forThreads calls f for every thread of pid, stopping at its first error.
func forThreads(pid int, f func(tid int) error) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := f(tid); err != nil {
			return err
		}
	}
	return nil
}

// setThreadAffinity pins one thread to cpus; a thread that has exited is
// not an error.
func setThreadAffinity(tid int, cpus []int) error {
	var mask [16]uint64 // 1024 CPUs
	for _, c := range cpus {
		mask[c/64] |= 1 << (c % 64)
	}
	_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask)))
	if errno != 0 && errno != syscall.ESRCH { // ESRCH: the thread exited meanwhile
		return fmt.Errorf("sched_setaffinity(%d): %w", tid, errno)
	}
	return nil
}
