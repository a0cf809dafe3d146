package main

// Memory (one worker): the worker's RSS before and after many unary calls.

import (
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
)

func rssKB(pid string) (int, error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			return strconv.Atoi(f[1])
		}
	}
	return 0, errors.New("no VmRSS")
}

func figureMemory(e *env, p params, t *table) error {
	pid, err := e.nginx.get("/pid")
	if err != nil {
		return err
	}
	// One warm-up round so that pools, JIT traces and connections exist.
	if _, err := e.nginx.lua("unary", p.memN/10, 100, p.conc); err != nil {
		return err
	}
	before, err := rssKB(pid)
	if err != nil {
		return err
	}
	log.Printf("memory: %d calls", p.memN)
	if _, err := e.nginx.lua("unary", p.memN, 100, p.conc); err != nil {
		return err
	}
	after, err := rssKB(pid)
	if err != nil {
		return err
	}
	t.add(row{section: "Memory (one worker)", name: fmt.Sprintf("RSS before / after %d unary calls", p.memN),
		subject:  fmt.Sprintf("%.1f MB → %.1f MB", float64(before)/1024, float64(after)/1024),
		baseline: "—", ratio: float64(after-before) / 1024, ratioLabel: "growth MB", target: "≈ 0",
		met: after-before < 4096})
	return nil
}
