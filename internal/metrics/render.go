package metrics

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// ErrBadSample is returned by Render for a line of one of our metrics
// that does not parse.
var ErrBadSample = errors.New("metrics: bad sample")

// sample is one parsed series: its family, the suffix of a histogram
// line, the labels other than le (as printed) and le.
type sample struct {
	fam    int
	suffix string // "", "_bucket", "_sum", "_count"
	labels string // `a="x",b="y"` without le
	le     string
}

// sorted is a sample, its sum and the keys of its place among the lines
// of its label set, computed once.
type sorted struct {
	sample
	rank int     // of suffix: buckets, sum, count
	leV  float64 // le as a number (+Inf for "+Inf")
	v    float64
}

// Render prints the Prometheus text format (0.0.4) for lines of
// "<key> <value>": a snapshot, or the keys and values of a shared dict
// that workers add their snapshots into (see Snapshot). Samples of the
// same series are summed. Keys that are not one of this package's metrics
// (a dict shared with something else) are ignored; a line of one of ours
// that does not parse is an error.
func Render(in []byte) ([]byte, error) {
	sums := make(map[sample]float64, bytes.Count(in, []byte{'\n'}))
	for lineNo := 1; len(in) > 0; lineNo++ {
		var line []byte
		line, in, _ = bytes.Cut(in, []byte{'\n'})
		if len(line) == 0 {
			continue
		}
		sp := bytes.LastIndexByte(line, ' ')
		if sp < 0 {
			continue // no value: not a sample of ours
		}
		key, val := string(line[:sp]), string(line[sp+1:])
		if !strings.HasPrefix(key, "qrpc_") {
			// A tag ("c", "g", "g<pid>") before the series.
			_, rest, ok := strings.Cut(key, " ")
			if !ok || !strings.HasPrefix(rest, "qrpc_") {
				continue
			}
			key = rest
		}
		s, ours, err := parseSeries(key)
		if !ours {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrBadSample, lineNo, err)
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil || math.IsNaN(v) {
			return nil, fmt.Errorf("%w: line %d: value %q", ErrBadSample, lineNo, val)
		}
		sums[s] += v
	}

	// Lines are ordered by labels, then (a histogram's) buckets by le,
	// sum, count: sorting the label sets of each family, then each set's
	// few lines, keeps a scrape of thousands of series to a sort of its
	// hundreds of label sets.
	type group struct {
		fam    int
		labels string
	}
	groups := make(map[group][]sorted)
	labelSets := make([][]string, len(families))
	size := 0
	for s, v := range sums {
		g := group{s.fam, s.labels}
		lines, seen := groups[g]
		if !seen {
			labelSets[s.fam] = append(labelSets[s.fam], s.labels)
		}
		groups[g] = append(lines, sorted{sample: s, rank: suffixRank(s.suffix), leV: leValue(s.le), v: v})
		size += len(s.labels) + len(s.le) + 48
	}
	var b bytes.Buffer
	b.Grow(size + 256*len(families))
	for i, f := range families {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.typ)
		slices.Sort(labelSets[i])
		for _, labels := range labelSets[i] {
			lines := groups[group{i, labels}]
			slices.SortFunc(lines, compareLines)
			for _, s := range lines {
				b.WriteString(f.name)
				b.WriteString(s.suffix)
				if s.labels != "" || s.suffix == "_bucket" {
					b.WriteByte('{')
					b.WriteString(s.labels)
					if s.suffix == "_bucket" {
						if s.labels != "" {
							b.WriteByte(',')
						}
						b.WriteString(`le="`)
						b.WriteString(s.le)
						b.WriteByte('"')
					}
					b.WriteByte('}')
				}
				b.WriteByte(' ')
				b.WriteString(formatValue(s.v))
				b.WriteByte('\n')
			}
		}
	}
	return b.Bytes(), nil
}

// suffixRank orders a histogram's lines: buckets, sum, count.
func suffixRank(suffix string) int {
	switch suffix {
	case "_sum":
		return 1
	case "_count":
		return 2
	}
	return 0
}

// compareLines orders the lines of one label set.
func compareLines(a, b sorted) int {
	if c := cmp.Compare(a.rank, b.rank); c != 0 {
		return c
	}
	return cmp.Compare(a.leV, b.leV)
}

func leValue(le string) float64 {
	if le == "" {
		return 0
	}
	v, err := strconv.ParseFloat(le, 64)
	if err != nil {
		return math.Inf(1)
	}
	return v
}

// parseSeries splits `name{labels}`. ours is false for a name that is not
// one of this package's metrics.
func parseSeries(key string) (s sample, ours bool, err error) {
	name, labels, hasLabels := strings.Cut(key, "{")
	s.fam = -1
	for i, f := range families {
		if f.typ != "histogram" {
			if name == f.name {
				s.fam = i
				break
			}
			continue
		}
		if suf, ok := strings.CutPrefix(name, f.name); ok && (suf == "_bucket" || suf == "_sum" || suf == "_count") {
			s.fam, s.suffix = i, suf
			break
		}
	}
	if s.fam < 0 {
		return s, false, nil
	}
	if !hasLabels {
		if s.suffix == "_bucket" {
			return s, true, errors.New("bucket without le")
		}
		return s, true, nil
	}
	if !strings.HasSuffix(labels, "}") {
		return s, true, fmt.Errorf("%q: no closing brace", key)
	}
	labels = labels[:len(labels)-1]
	all := labels
	leFrom, leTo := 0, 0 // the pair le="..." in all
	for labels != "" {
		eq := strings.Index(labels, `="`)
		if eq <= 0 {
			return s, true, fmt.Errorf("%q: expected name=\"value\"", key)
		}
		lname := labels[:eq]
		end := closingQuote(labels, eq+2)
		if end < 0 {
			return s, true, fmt.Errorf("%q: unterminated label value", key)
		}
		if lname == "le" && s.suffix == "_bucket" {
			if leTo != 0 {
				// Printed as it stands, the line would name le twice:
				// a series names each label once.
				return s, true, fmt.Errorf("%q: two le labels", key)
			}
			s.le = labels[eq+2 : end]
			leFrom = len(all) - len(labels)
			leTo = leFrom + end + 1
		}
		labels = labels[end+1:]
		if labels != "" {
			if labels[0] != ',' {
				return s, true, fmt.Errorf("%q: expected ',' between labels", key)
			}
			labels = labels[1:]
		}
	}
	if s.suffix == "_bucket" && s.le == "" {
		return s, true, errors.New("bucket without le")
	}
	// The labels as printed, le taken out: a substring of key unless le
	// stands between two others.
	before, after := strings.TrimSuffix(all[:leFrom], ","), all[leTo:]
	switch {
	case leTo == 0:
		s.labels = all
	case after == "":
		s.labels = before
	case before == "":
		s.labels = after[1:]
	default:
		s.labels = before + after
	}
	return s, true, nil
}

// closingQuote returns the index of the '"' that ends a label value
// starting at i, skipping escaped characters, or -1.
func closingQuote(s string, i int) int {
	for ; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}
