package main

// The report drawn: one horizontal bar chart per section, each bar a
// figure's ratio to its baseline, with the baseline (1) and the figure's
// target marked, so that the figures read without the table. Plain SVG
// written here; no external tools.

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

const (
	chFont     = 12   // px
	chCharW    = 6.6  // average width of a character at chFont, px
	chRowH     = 22   // px per bar
	chBarW     = 320  // px of the value axis
	chValueW   = 480  // px right of the axis for the value text
	chMaxLabel = 105  // characters of a row name before it is cut
	chClip     = 3.0  // axis limit, in multiples of the baseline or target
	chPad      = 12.0 // px
)

var (
	chMet    = "#2e8b57"
	chMissed = "#c0392b"
	chNone   = "#7f8c8d"
	chTarget = "#1f3a93"
)

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// better says which way a ratio is good, from its label.
func better(label string) string {
	switch {
	case strings.HasPrefix(label, "throughput"):
		return "higher is better"
	case strings.HasSuffix(label, "ratio"):
		return "lower is better"
	}
	return ""
}

// niceStep is a round tick interval for an axis spanning span.
func niceStep(span float64) float64 {
	raw := span / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

func (t *table) svg(p params) []byte {
	labelW := 0
	for _, r := range t.rows {
		labelW = max(labelW, utf8.RuneCountInString(cut(r.name, chMaxLabel)))
	}
	lw := float64(labelW)*chCharW + chPad
	width := chPad + lw + chBarW + chValueW
	var body strings.Builder
	y := chPad
	mode := "full run"
	if p.quick {
		mode = "quick run (BENCH_QUICK=1)"
	}
	sub := fmt.Sprintf("%s. Medians of %d run(s); CPU steal during the run: %.1f%%.", t.machine, p.runs, 100*t.steal)
	if t.header != "" {
		mode, sub = "merged runs: see the notes", t.header
	}
	fmt.Fprintf(&body, `<text x="%.0f" y="%.0f" font-size="16" font-weight="bold">lua-resty-ffi-qrpc vs its baselines: ratio per figure (make bench, %s)</text>`+"\n", chPad, y+14, mode)
	y += 22
	fmt.Fprintf(&body, `<text x="%.0f" y="%.0f" fill="#555">%s</text>`+"\n", chPad, y+12, xmlEscape(sub))
	y += 18
	fmt.Fprintf(&body, `<text x="%.0f" y="%.0f" fill="#555">Bars: this module's figure divided by the baseline's (the table: bench/results.md). Dashed line: the baseline (1). Blue tick: the target. Green: target met, red: missed, grey: no target.</text>`+"\n", chPad, y+12)
	y += 26
	for _, rows := range t.sections() {
		var shown []row
		for _, r := range rows {
			if !r.noRatio {
				shown = append(shown, r)
			}
		}
		if len(shown) == 0 {
			continue
		}
		y = t.chartSection(&body, shown, lw, y)
	}
	if len(t.notes) > 0 {
		for _, n := range t.notes {
			fmt.Fprintf(&body, `<text x="%.0f" y="%.0f" fill="#555">%s</text>`+"\n", chPad, y+12, xmlEscape(cut(n, int((width-2*chPad)/chCharW))))
			y += 18
		}
	}
	y += chPad
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="DejaVu Sans, Verdana, sans-serif" font-size="%d">`+"\n", width, y, width, y, chFont)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	b.WriteString(body.String())
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// chartSection draws one section's chart from height y and returns the
// height below it.
func (t *table) chartSection(b *strings.Builder, rows []row, lw, y float64) float64 {
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-weight="bold">%s</text>`+"\n", chPad, y+14, xmlEscape(rows[0].section))
	y += 22
	// The axis spans 0 (or the lowest value) to the highest of the
	// values, the targets and the baseline's 1.
	lo, hi := 0.0, 1.0
	ratios := false
	for _, r := range rows {
		lo, hi = math.Min(lo, r.ratio), math.Max(hi, r.ratio)
		if v, op := targetValue(r.target); op != "" {
			hi = math.Max(hi, v)
		}
		ratios = ratios || strings.HasSuffix(r.ratioLabel, "ratio")
	}
	// One outlier (a 13× row) would squeeze the others to slivers: the
	// axis stops at chClip times the larger of 1 and the targets, and
	// longer bars end in an arrow (their value is written beside them).
	limit := chClip
	for _, r := range rows {
		if v, op := targetValue(r.target); op != "" {
			limit = math.Max(limit, chClip*v)
		}
	}
	hi = math.Min(hi, limit) * 1.1
	x0 := chPad + lw
	scale := chBarW / (hi - lo)
	xOf := func(v float64) float64 { return x0 + (v-lo)*scale }
	top, bottom := y, y+float64(len(rows))*chRowH
	// ticks
	step := niceStep(hi - lo)
	for v := math.Ceil(lo/step) * step; v <= hi+1e-9; v += step {
		x := xOf(v)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#e5e5e5"/>`+"\n", x, top, x, bottom)
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" fill="#777" font-size="10" text-anchor="middle">%g</text>`+"\n", x, bottom+12, math.Round(v*100)/100)
	}
	for i, r := range rows {
		ry := top + float64(i)*chRowH
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f">%s</text>`+"\n", chPad, ry+15, xmlEscape(cut(r.name, chMaxLabel)))
		colour := chNone
		if r.target != "" {
			colour = chMissed
			if r.met {
				colour = chMet
			}
		}
		xa, xb := xOf(math.Min(0, r.ratio)), xOf(math.Min(math.Max(0, r.ratio), hi))
		fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%d" fill="%s"/>`+"\n", xa, ry+4, math.Max(xb-xa, 1), chRowH-8, colour)
		if r.ratio > hi {
			fmt.Fprintf(b, `<path d="M%.1f %.0f l8 %d l-8 %d z" fill="%s"/>`+"\n", xb, ry+4, (chRowH-8)/2, (chRowH-8)/2, colour)
		}
		if v, op := targetValue(r.target); op != "" {
			fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="%s" stroke-width="3"/>`+"\n", xOf(v), ry+1, xOf(v), ry+chRowH-1, chTarget)
		}
		text := fmt.Sprintf("%s× (%s vs %s)", r.ratioText(), r.subject, r.baseline)
		if !strings.HasSuffix(r.ratioLabel, "ratio") {
			text = fmt.Sprintf("%s %s (%s)", r.ratioText(), r.ratioLabel, r.subject)
		}
		if r.target != "" {
			mark := "missed"
			if r.met {
				mark = "met"
			}
			text += fmt.Sprintf(", target %s %s", r.target, mark)
		}
		if bt := better(r.ratioLabel); bt != "" {
			text += "; " + bt
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" font-size="11">%s</text>`+"\n", x0+chBarW+6, ry+15, xmlEscape(text))
	}
	if ratios {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#333" stroke-dasharray="4 3"/>`+"\n", xOf(1), top, xOf(1), bottom)
	}
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#333"/>`+"\n", x0, top, x0, bottom)
	return bottom + 30
}
