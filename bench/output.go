package main

// Where a run writes its table and chart.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The committed results are those of a full run; any other run writes to
// scratch files under bench/out/ (ignored by git), so that a quick look
// never leaves the tree dirty or replaces the committed table.
const (
	committedMD  = "bench/results.md"
	committedSVG = "bench/results.svg"
	scratchMD    = "bench/out/results.md"
)

// outputPaths returns where a run writes its table and chart ("" = no
// chart). update asks for the committed files, which a quick run may not
// write, whatever the flags say.
func outputPaths(quick, update bool, out, svg string) (string, string, error) {
	if out == "" {
		out = scratchMD
		if update {
			out = committedMD
		}
	}
	switch svg {
	case "":
		svg = strings.TrimSuffix(out, ".md") + ".svg"
	case "-":
		svg = ""
	}
	committed := filepath.Clean(out) == committedMD || (svg != "" && filepath.Clean(svg) == committedSVG)
	if committed && quick {
		return "", "", fmt.Errorf("a quick run does not write the committed %s or %s", committedMD, committedSVG)
	}
	if committed && !update {
		return "", "", fmt.Errorf("writing %s or %s needs -update (make bench-update)", committedMD, committedSVG)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", "", fmt.Errorf("output directory: %w", err)
	}
	return out, svg, nil
}
