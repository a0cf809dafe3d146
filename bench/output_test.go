package main

import (
	"os"
	"path/filepath"
	"testing"
)

// A run writes the committed results only when asked to and only when it
// is a full run; everything else goes to scratch files.
func TestOutputPaths(t *testing.T) {
	dir := t.TempDir()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// outputPaths creates the output directory: work in a scratch tree.
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.Chdir(wd) }()

	cases := []struct {
		name          string
		quick, update bool
		out, svg      string
		md, chart     string
		fail          bool
	}{
		{name: "quick default", quick: true, md: scratchMD, chart: "bench/out/results.svg"},
		{name: "full default", md: scratchMD, chart: "bench/out/results.svg"},
		{name: "full update", update: true, md: committedMD, chart: committedSVG},
		{name: "quick update", quick: true, update: true, fail: true},
		{name: "quick into the committed table", quick: true, out: committedMD, fail: true},
		{name: "quick into the committed chart", quick: true, out: "x.md", svg: committedSVG, fail: true},
		{name: "full into the committed table without update", out: "./bench/results.md", fail: true},
		{name: "elsewhere, no chart", quick: true, out: "o/r.md", svg: "-", md: "o/r.md", chart: ""},
	}
	for _, c := range cases {
		md, chart, err := outputPaths(c.quick, c.update, c.out, c.svg)
		if c.fail {
			if err == nil {
				t.Errorf("%s: want an error, got %q %q", c.name, md, chart)
			}
			continue
		}
		if err != nil || md != c.md || chart != c.chart {
			t.Errorf("%s: got %q %q %v, want %q %q", c.name, md, chart, err, c.md, c.chart)
		}
		if _, err := os.Stat(filepath.Dir(md)); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}
