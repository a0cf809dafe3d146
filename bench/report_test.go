package main

import (
	"encoding/xml"
	"io"
	"strings"
	"testing"
)

func sampleTable() *table {
	t := &table{machine: "test machine <2 vCPU>"}
	t.add(row{section: "A", name: "a time", subject: "1 s", baseline: "2 s", ratio: 0.5, ratioLabel: "time ratio"}.withTarget("≤ 0.7"))
	t.add(row{section: "B", name: "b rate", subject: "x", baseline: "y", ratio: 13.4, ratioLabel: "throughput ratio"}.withTarget("≥ 1.5"))
	t.add(row{section: "A", name: "a reading", subject: "—", baseline: "3 µs", noRatio: true})
	t.add(row{section: "B", name: "b time & more", subject: "x", baseline: "y", ratio: 1.2, ratioLabel: "time ratio"})
	t.add(row{section: "C", name: "growth", subject: "1 MB → 0.9 MB", baseline: "—", ratio: -0.1, ratioLabel: "growth MB", target: "≈ 0", met: true})
	t.note("a note")
	return t
}

func TestWithTarget(t *testing.T) {
	for _, c := range []struct {
		ratio  float64
		target string
		met    bool
	}{
		{1.6, "≥ 1.5", true}, {1.4, "≥ 1.5", false}, {0.7, "≤ 0.7", true}, {0.71, "≤ 0.7", false}, {1.1, "≤ 1.10", true},
	} {
		if got := (row{ratio: c.ratio}).withTarget(c.target).met; got != c.met {
			t.Errorf("ratio %v, target %q: met %v, want %v", c.ratio, c.target, got, c.met)
		}
	}
}

// A ratio that rounds onto its target shows the digits that tell it
// from the target; others keep two decimals.
func TestRatioTextTellsTargetApart(t *testing.T) {
	for _, c := range []struct {
		ratio  float64
		target string
		want   string
	}{
		{1.997, "≥ 2", "1.997"}, {2.0004, "≥ 2", "2.0004"}, {2, "≥ 2", "2.00"}, {1.5, "≥ 2", "1.50"},
		{1.1049, "≤ 1.10", "1.105"}, {1.0951, "≤ 1.10", "1.095"}, {1.2345, "", "1.23"},
	} {
		if got := (row{ratio: c.ratio}).withTarget(c.target).ratioText(); got != c.want {
			t.Errorf("ratio %v, target %q: %q, want %q", c.ratio, c.target, got, c.want)
		}
	}
}

// The markdown has one heading per section, in order of first
// appearance, with every row of the section under it.
func TestMarkdownGroupsSections(t *testing.T) {
	md := sampleTable().markdown(params{runs: 1})
	for _, s := range []string{"A", "B", "C"} {
		if n := strings.Count(md, "| **"+s+"** |"); n != 1 {
			t.Errorf("section %s: %d headings, want 1", s, n)
		}
	}
	a, reading, b := strings.Index(md, "| **A**"), strings.Index(md, "| a reading |"), strings.Index(md, "| **B**")
	if !(a < reading && reading < b) {
		t.Errorf("row of section A not under its heading:\n%s", md)
	}
	if !strings.Contains(md, "| a reading | — | 3 µs | — |") {
		t.Errorf("a reading without ratio should print —:\n%s", md)
	}
	if !strings.Contains(md, "≤ 0.7 (met)") || !strings.Contains(md, "≥ 1.5 (met)") {
		t.Errorf("targets not marked:\n%s", md)
	}
}

// The chart is well-formed SVG with one title per section, one bar per
// row that has a ratio, one tick per target, and an arrow on the clipped
// bar.
func TestSVG(t *testing.T) {
	svg := string(sampleTable().svg(params{quick: true}))
	d := xml.NewDecoder(strings.NewReader(svg))
	counts := map[string]int{}
	var texts []string
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, svg)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			counts[tok.Name.Local]++
		case xml.CharData:
			texts = append(texts, string(tok))
		}
	}
	all := strings.Join(texts, "\n")
	for _, s := range []string{"A", "B", "C"} {
		if !strings.Contains(all, "\n"+s+"\n") {
			t.Errorf("no title for section %s", s)
		}
	}
	// 4 bars + the white background
	if counts["rect"] != 5 {
		t.Errorf("%d rects, want 5 (background + 4 bars)", counts["rect"])
	}
	if counts["path"] != 1 {
		t.Errorf("%d arrows, want 1 (the 13.4x bar)", counts["path"])
	}
	if n := strings.Count(svg, `stroke="`+chTarget+`"`); n != 3 {
		t.Errorf("%d target ticks, want 3", n)
	}
	if strings.Contains(all, "a reading") {
		t.Error("a row without ratio was charted")
	}
	for _, want := range []string{"13.40× (x vs y), target ≥ 1.5 met; higher is better", "b time & more", "test machine <2 vCPU>", "a note"} {
		if !strings.Contains(all, want) {
			t.Errorf("chart text lacks %q", want)
		}
	}
}
