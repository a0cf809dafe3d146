package main

import (
	"fmt"
	"strings"
	"testing"
)

func rowKey(r row) string {
	return fmt.Sprintf("%s|%s|%s|%s|%.2f|%s|%v|%s|%v", r.section, r.name, r.subject, r.baseline, r.ratio, r.ratioLabel, r.noRatio, r.target, r.met)
}

// A report read back gives the rows it was written from (ratios to the
// two decimals printed).
func TestParseReportRoundTrip(t *testing.T) {
	tb := sampleTable()
	header, rows, notes, err := parseReport(tb.markdown(params{runs: 1}))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(header, "Machine: test machine <2 vCPU>. Mode: full") {
		t.Errorf("header %q", header)
	}
	if len(rows) != len(tb.rows) {
		t.Fatalf("%d rows, want %d", len(rows), len(tb.rows))
	}
	// markdown groups rows by section: compare in that order.
	var want []row
	for _, s := range tb.sections() {
		want = append(want, s...)
	}
	for i := range want {
		if got, w := rowKey(rows[i]), rowKey(want[i]); got != w {
			t.Errorf("row %d: %s\nwant        %s", i, got, w)
		}
	}
	if len(notes) != 1 || notes[0] != "a note" {
		t.Errorf("notes %q", notes)
	}
	if _, _, _, err := parseReport("# not a report\n"); err == nil {
		t.Error("a file that is not a report parsed")
	}
	if _, _, _, err := parseReport("Machine: x\n\n| **A** | | | | |\n| a | b | c | 1.0 x | ≥ 1 (maybe) |\n"); err == nil {
		t.Error("a bad target parsed")
	}
}

// -merge replaces the sections measured again in place (by family: the
// name before its colon), keeps the others and the old first line,
// appends new sections, and says so.
func TestMerge(t *testing.T) {
	old := sampleTable().markdown(params{runs: 1})
	fresh := &table{machine: "later machine"}
	fresh.add(row{section: "D", name: "d new", subject: "1", baseline: "2", ratio: 0.5, ratioLabel: "time ratio"})
	// renamed: "B: more" replaces section "B" (same family)
	fresh.add(row{section: "B: more", name: "b again", subject: "3", baseline: "1", ratio: 3, ratioLabel: "throughput ratio"}.withTarget("≥ 1.5"))
	if err := fresh.merge(old, params{quick: true, runs: 1}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range fresh.rows {
		got = append(got, r.section+":"+r.name)
	}
	want := "A:a time,A:a reading,B: more:b again,C:growth,D:d new"
	if strings.Join(got, ",") != want {
		t.Fatalf("rows %s, want %s", strings.Join(got, ","), want)
	}
	md := fresh.markdown(params{quick: true, runs: 1})
	if !strings.HasPrefix(md, "Machine: test machine <2 vCPU>. Mode: full") {
		t.Errorf("the old first line is gone:\n%s", md)
	}
	if !strings.Contains(md, "Measured again later with -merge (machine: later machine; mode: quick (BENCH_QUICK=1); CPU steal 0.0%): D; B: more.") ||
		!strings.Contains(md, "\na note\n") {
		t.Errorf("notes:\n%s", md)
	}
	if strings.Contains(md, "b time & more") {
		t.Error("an old row of a section measured again is still there")
	}
	if svg := string(fresh.svg(params{quick: true, runs: 1})); !strings.Contains(svg, "merged runs") || !strings.Contains(svg, "b again") {
		t.Error("the chart does not show the merged report")
	}
}

// A second -merge takes the sections it measures again out of the notes
// of earlier merges, and drops a note left with none.
func TestMergeAgainDropsStaleNotes(t *testing.T) {
	old := sampleTable().markdown(params{runs: 1})
	first := &table{machine: "first"}
	first.add(row{section: "A", name: "a time", subject: "1", baseline: "2", ratio: 0.5, ratioLabel: "time ratio"})
	first.add(row{section: "B", name: "b time & more", subject: "1", baseline: "2", ratio: 0.5, ratioLabel: "time ratio"})
	first.add(row{section: "B: two (one; two)", name: "b two", subject: "1", baseline: "2", ratio: 0.5, ratioLabel: "time ratio"})
	if err := first.merge(old, params{runs: 1}); err != nil {
		t.Fatal(err)
	}
	second := &table{machine: "second"}
	second.add(row{section: "B", name: "b time & more", subject: "1", baseline: "2", ratio: 0.5, ratioLabel: "time ratio"})
	if err := second.merge(first.markdown(params{runs: 1}), params{runs: 1}); err != nil {
		t.Fatal(err)
	}
	md := second.markdown(params{runs: 1})
	if !strings.Contains(md, "(machine: first; mode: full; CPU steal 0.0%): A. The rest") {
		t.Errorf("the first merge's note should name A only:\n%s", md)
	}
	if !strings.Contains(md, "(machine: second; mode: full; CPU steal 0.0%): B. The rest") {
		t.Errorf("the second merge's note is missing:\n%s", md)
	}
	third := &table{machine: "third"}
	third.add(row{section: "A", name: "a time", subject: "1", baseline: "2", ratio: 0.5, ratioLabel: "time ratio"})
	if err := third.merge(md, params{runs: 1}); err != nil {
		t.Fatal(err)
	}
	if md := third.markdown(params{runs: 1}); strings.Contains(md, "machine: first") {
		t.Errorf("a note whose every section was measured again is still there:\n%s", md)
	}
}
