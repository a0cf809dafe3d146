package main

// A flame graph of a profile (breakdown.go) as SVG: the stacks merged
// from the root out, each frame's width its share of the CPU time, the
// leaf frames' colour that of their component (attribute.go). Written
// here rather than with Brendan Gregg's scripts, which the repository
// does not carry.

import (
	"fmt"
	"hash/fnv"
	"html"
	"sort"
	"strings"
)

type flameNode struct {
	name     string
	comp     string
	ns       int64
	children map[string]*flameNode
}

func (n *flameNode) child(name, comp string) *flameNode {
	if n.children == nil {
		n.children = map[string]*flameNode{}
	}
	c := n.children[name]
	if c == nil {
		c = &flameNode{name: name, comp: comp}
		n.children[name] = c
	}
	return c
}

// flameName is how a frame reads in the graph: its function, or its file
// when it has none.
func flameName(f frame) string {
	if f.sym != "" && f.sym != "[unknown]" {
		return f.sym
	}
	if f.dso == "" || f.dso == "[unknown]" {
		return "[unknown]"
	}
	return "[" + f.dso[strings.LastIndexByte(f.dso, '/')+1:] + "]"
}

func flameTree(p profile) *flameNode {
	root := &flameNode{name: "all"}
	for _, s := range p.samples {
		root.ns += s.ns
		thread := "other threads (Go's)"
		if s.main {
			thread = "main thread"
		}
		n := root.child(thread, "")
		n.ns += s.ns
		comp := component(s.frames, s.main)
		for i := len(s.frames) - 1; i >= 0; i-- {
			c := ""
			if i == 0 {
				c = comp
			}
			n = n.child(flameName(s.frames[i]), c)
			n.ns += s.ns
		}
	}
	return root
}

const (
	flameWidth  = 1200.0
	flameRow    = 16.0
	flameMargin = 10.0
)

// flameColour is a warm colour per component (stable across runs), so
// that one component's frames read as one.
func flameColour(name, comp string) string {
	key := comp
	if key == "" {
		key = name
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	v := h.Sum32()
	return fmt.Sprintf("rgb(%d,%d,%d)", 200+v%56, 80+(v>>8)%130, 30+(v>>16)%60)
}

func flameSVG(title string, p profile) []byte {
	root := flameTree(p)
	depth := 0
	var measure func(n *flameNode, d int)
	measure = func(n *flameNode, d int) {
		depth = max(depth, d)
		for _, c := range n.children {
			measure(c, d+1)
		}
	}
	measure(root, 1)
	height := float64(depth)*flameRow + 3*flameMargin + 20
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="monospace" font-size="11">
<rect width="100%%" height="100%%" fill="#fdfdf8"/>
<text x="%.0f" y="18" font-size="14">%s</text>
`, flameWidth+2*flameMargin, height, flameMargin, html.EscapeString(title))
	if root.ns == 0 {
		b.WriteString("</svg>\n")
		return []byte(b.String())
	}
	scale := flameWidth / float64(root.ns)
	var draw func(n *flameNode, x float64, d int)
	draw = func(n *flameNode, x float64, d int) {
		w := float64(n.ns) * scale
		if w < 0.3 {
			return
		}
		y := height - flameMargin - float64(d)*flameRow
		share := 100 * float64(n.ns) / float64(root.ns)
		label := n.name
		if n.comp != "" {
			label += " — " + n.comp
		}
		fmt.Fprintf(&b, `<g><title>%s (%.2f%%)</title><rect x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="%s" stroke="#fdfdf8" stroke-width="0.5"/>`,
			html.EscapeString(label), share, flameMargin+x, y, w, flameRow-1, flameColour(n.name, n.comp))
		if chars := int(w / 6.6); chars >= 4 {
			text := n.name
			if len(text) > chars {
				text = text[:chars-2] + ".."
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`, flameMargin+x+2, y+flameRow-4, html.EscapeString(text))
		}
		b.WriteString("</g>\n")
		kids := make([]*flameNode, 0, len(n.children))
		for _, c := range n.children {
			kids = append(kids, c)
		}
		sort.Slice(kids, func(i, j int) bool { return kids[i].name < kids[j].name })
		for _, c := range kids {
			draw(c, x, d+1)
			x += float64(c.ns) * scale
		}
	}
	draw(root, 0, 1)
	b.WriteString("</svg>\n")
	return []byte(b.String())
}
