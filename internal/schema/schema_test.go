package schema

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestOptionsConsistent: names are unique, bounds come in pairs and hold
// the default, places are known, and what an option needs exists.
func TestOptionsConsistent(t *testing.T) {
	seen := map[string]bool{}
	for _, o := range Options {
		if seen[o.Name] {
			t.Errorf("%s twice", o.Name)
		}
		seen[o.Name] = true
	}
	for _, o := range Options {
		if (o.Min == nil) != (o.Max == nil) {
			t.Errorf("%s: min and max go together", o.Name)
		}
		if o.Min != nil && o.Default != "" {
			d, err := strconv.ParseFloat(o.Default, 64)
			if err != nil || d < *o.Min || d > *o.Max || (o.MinOpen && d == *o.Min) {
				t.Errorf("%s: default %s out of %v..%v", o.Name, o.Default, *o.Min, *o.Max)
			}
		}
		if len(o.Where) == 0 {
			t.Errorf("%s: accepted nowhere", o.Name)
		}
		for _, w := range o.Where {
			switch w {
			case Connect, Call, Event, Method, Configure:
			default:
				t.Errorf("%s: unknown place %q", o.Name, w)
			}
		}
		if o.Needs != "" && !seen[o.Needs] {
			t.Errorf("%s needs %s, which is no option", o.Name, o.Needs)
		}
		if o.Doc == "" {
			t.Errorf("%s: no doc", o.Name)
		}
	}
}

func TestSpliceDoc(t *testing.T) {
	doc := "a\n" + DocBegin + "STALE-TEXT\n" + DocEnd + "b\n"
	got, err := SpliceDoc(doc)
	if err != nil || !strings.HasPrefix(got, "a\n"+DocBegin) || !strings.HasSuffix(got, DocEnd+"b\n") || strings.Contains(got, "STALE-TEXT") {
		t.Fatalf("%v\n%s", err, got)
	}
	if _, err := SpliceDoc("no markers"); err == nil {
		t.Fatal("no markers accepted")
	}
}

// TestCheckWire: the options agree with the record keys, and each kind
// of drift CheckWire is there for is caught.
func TestCheckWire(t *testing.T) {
	if errs := CheckWire(Options); len(errs) > 0 {
		t.Fatal(strings.Join(errs, "\n"))
	}
	with := func(name string, wire ...string) []Option {
		opts := slices.Clone(Options)
		for i := range opts {
			if opts[i].Name == name {
				opts[i].Wire = wire
			}
		}
		return opts
	}
	for _, c := range []struct {
		opts []Option
		want string
	}{
		{with("balance"), "balance: no Wire"},
		{with("balance", "BALANSE"), `balance: Wire "BALANSE" is no record key`},
		{with("retries", "RETRIES"), "retries: accepted at call, but none of its records [RETRIES] is read by UNARY"},
		{with("resolve", InCmd), "record RESOLVE_MS (CONNECT) carries no option"},
		{with("headers", "RETRIES"), "headers: accepted at call, but none of its records [RETRIES] is read by UNARY"},
		{with("host", InLua), "host: Wire, but not an option of a command"},
	} {
		got := strings.Join(CheckWire(c.opts), "\n")
		if !strings.Contains(got, c.want) {
			t.Errorf("want %q among:\n%s", c.want, got)
		}
	}
}
