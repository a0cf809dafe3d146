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

// Render prints the Prometheus text format (0.0.4) for lines of
// "<key> <value>": a snapshot, or the keys and values of a shared dict
// that workers add their snapshots into (see Snapshot). Samples of the
// same series are summed. Keys that are not one of this package's metrics
// (a dict shared with something else) are ignored; a line of one of ours
// that does not parse is an error.
func Render(in []byte) ([]byte, error) {
	sums := make(map[sample]float64)
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

	byFam := make([][]sample, len(families))
	for s := range sums {
		byFam[s.fam] = append(byFam[s.fam], s)
	}
	var b bytes.Buffer
	for i, f := range families {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.typ)
		list := byFam[i]
		slices.SortFunc(list, compareSamples)
		for _, s := range list {
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
			b.WriteString(formatValue(sums[s]))
			b.WriteByte('\n')
		}
	}
	return b.Bytes(), nil
}

// suffixRank orders a histogram's lines: buckets, sum, count.
var suffixRank = map[string]int{"": 0, "_bucket": 0, "_sum": 1, "_count": 2}

func compareSamples(a, b sample) int {
	if c := strings.Compare(a.labels, b.labels); c != 0 {
		return c
	}
	if c := cmp.Compare(suffixRank[a.suffix], suffixRank[b.suffix]); c != 0 {
		return c
	}
	return cmp.Compare(leValue(a.le), leValue(b.le))
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
	var kept []string
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
		pair := labels[:end+1]
		if lname == "le" && s.suffix == "_bucket" {
			s.le = labels[eq+2 : end]
		} else {
			kept = append(kept, pair)
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
	s.labels = strings.Join(kept, ",")
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
