package main

// -merge: a run of some sections (-only) replaces those sections in the
// report already written (-out) and keeps the others, so that one
// section can be measured again without a whole `make bench`; the chart
// is redrawn from the merged table. The report says which sections come
// from which run.

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// parseReport reads back a report written by table.markdown: its first
// line, its rows and its notes.
func parseReport(md string) (header string, rows []row, notes []string, err error) {
	lines := strings.Split(md, "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "Machine: ") {
		return "", nil, nil, errors.New("not a bench report: no Machine line first")
	}
	header = lines[0]
	section := ""
	baselines := false
	for i, l := range lines[1:] {
		switch {
		case l == "":
		case strings.HasPrefix(l, "| figure |"), strings.HasPrefix(l, "|---"):
		case strings.HasPrefix(l, "| **"):
			name, _, ok := strings.Cut(strings.TrimPrefix(l, "| **"), "** |")
			if !ok {
				return "", nil, nil, fmt.Errorf("line %d: bad section heading", i+2)
			}
			section = name
		case strings.HasPrefix(l, "| "):
			r, err := parseRow(l)
			if err != nil {
				return "", nil, nil, fmt.Errorf("line %d: %w", i+2, err)
			}
			if section == "" {
				return "", nil, nil, fmt.Errorf("line %d: a row before any section", i+2)
			}
			r.section = section
			rows = append(rows, r)
		case strings.HasPrefix(l, "Baselines: "):
			baselines = true
		case baselines:
			notes = append(notes, l)
		}
	}
	return header, rows, notes, nil
}

// parseRow reads a line of row.markdown.
func parseRow(l string) (row, error) {
	f := strings.Split(strings.TrimSuffix(strings.TrimPrefix(l, "| "), " |"), " | ")
	if len(f) != 5 {
		return row{}, fmt.Errorf("%d cells, want 5", len(f))
	}
	r := row{name: f[0], subject: f[1], baseline: f[2]}
	if f[3] == "—" {
		r.noRatio = true
	} else {
		num, label, _ := strings.Cut(f[3], " ")
		v, err := strconv.ParseFloat(num, 64)
		if err != nil {
			return row{}, fmt.Errorf("ratio %q", f[3])
		}
		r.ratio, r.ratioLabel = v, label
	}
	if f[4] != "" {
		target, mark, ok := strings.Cut(f[4], " (")
		if !ok || (mark != "met)" && mark != "missed)") {
			return row{}, fmt.Errorf("target %q", f[4])
		}
		r.target, r.met = target, mark == "met)"
	}
	return r, nil
}

// family is a section's name up to its first colon: a figure's sections
// share it ("Pools: ...", "Protobuf: ..."), so that sections renamed by a
// figure replace their old selves.
func family(section string) string {
	f, _, _ := strings.Cut(section, ":")
	return f
}

// merge puts the rows of the sections t measured in place of the old
// report's sections of the same families, keeps the old report's other
// sections and its first line, and says in a note which sections were
// measured again.
func (t *table) merge(old string, p params) error {
	header, oldRows, oldNotes, err := parseReport(old)
	if err != nil {
		return err
	}
	fresh := t.sections()
	byFamily := map[string][]row{}
	var names, order []string
	for _, rows := range fresh {
		f := family(rows[0].section)
		if _, ok := byFamily[f]; !ok {
			order = append(order, f)
		}
		byFamily[f] = append(byFamily[f], rows...)
		names = append(names, rows[0].section)
	}
	var merged []row
	done := map[string]bool{}
	for _, r := range oldRows {
		f := family(r.section)
		if rows, ok := byFamily[f]; ok {
			if !done[f] {
				merged = append(merged, rows...)
				done[f] = true
			}
			continue
		}
		merged = append(merged, r)
	}
	for _, f := range order {
		if !done[f] {
			merged = append(merged, byFamily[f]...)
		}
	}
	mode := "full"
	if p.quick {
		mode = "quick (BENCH_QUICK=1)"
	}
	var notes []string
	for _, n := range oldNotes {
		if n, keep := dropRemeasured(n, byFamily); keep {
			notes = append(notes, n)
		}
	}
	notes = append(notes, fmt.Sprintf(mergedNote,
		t.machine, mode, 100*t.steal, strings.Join(names, "; ")))
	notes = append(notes, t.notes...)
	t.header, t.rows, t.notes = header, merged, notes
	return nil
}

const (
	mergedNote = "Measured again later with -merge (machine: %s; mode: %s; CPU steal %.1f%%): %s" + mergedTail
	mergedTail = ". The rest comes from the run described on the first line."
)

// dropRemeasured takes out of an earlier merge's note the sections of the
// families measured again now, which that note no longer describes;
// keep is false when none is left. Other notes are kept as they are.
func dropRemeasured(note string, fresh map[string][]row) (string, bool) {
	head, list, ok := strings.Cut(note, "%): ")
	if !ok || !strings.HasPrefix(note, "Measured again later with -merge (") || !strings.HasSuffix(list, mergedTail) {
		return note, true
	}
	// A section's name may hold "; " inside parentheses: "(same
	// machine; for information)".
	var secs []string
	for _, part := range strings.Split(strings.TrimSuffix(list, mergedTail), "; ") {
		if n := len(secs); n > 0 && strings.Count(secs[n-1], "(") > strings.Count(secs[n-1], ")") {
			secs[n-1] += "; " + part
			continue
		}
		secs = append(secs, part)
	}
	var left []string
	for _, sec := range secs {
		if _, again := fresh[family(sec)]; !again {
			left = append(left, sec)
		}
	}
	if len(left) == 0 {
		return "", false
	}
	return head + "%): " + strings.Join(left, "; ") + mergedTail, true
}
