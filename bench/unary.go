package main

// Unary over QUIC (loopback): calls from Lua in the nginx worker against
// the plain Go client making the same calls to the same server.

import (
	"fmt"
	"log"
)

func figureUnary(e *env, p params, t *table) error {
	const sec = "Unary over QUIC (loopback)"
	for i, size := range p.unSizes {
		n := p.seqN
		if i > 0 {
			// Larger bodies with half the calls: what keeps the full run
			// under ten minutes.
			n = p.seqN / 2
		}
		log.Printf("unary %s sequential", sizeName(size))
		l, g, err := pair(p.runs,
			e.nginx.measure("unary", n, size, 1),
			e.goMeasure(unpinned, "seq", n, size, 1))
		if err != nil {
			return err
		}
		t.add(timeRow(sec, fmt.Sprintf("%s, %d sequential calls: time", sizeName(size), n), l, g).withTarget("≤ 1.10"))
		if i > 0 {
			continue
		}
		// What any design on stock nginx with its client in Go pays here,
		// unpinned too (designfloor.go; breakdown.go has it pinned).
		log.Printf("unary %s sequential: the design floor, nginx's way", sizeName(size))
		f, g2, err := pair(p.runs,
			e.goMeasure(unpinned, "floor-"+floorNginx, n, size, 1),
			e.goMeasure(unpinned, "seq", n, size, 1))
		if err != nil {
			return err
		}
		t.add(timeRow(sec, fmt.Sprintf("%s, %d sequential calls: the design floor, nginx's way (the Go client's calls handed from a C thread and back, 1 P), vs the Go client: time", sizeName(size), n), f, g2))
	}
	log.Printf("unary 100 B, %d concurrent", p.conc)
	l, g, err := pair(p.runs,
		e.nginx.measure("unary", p.parN, 100, p.conc),
		e.goMeasure(unpinned, "par", p.parN, 100, p.conc))
	if err != nil {
		return err
	}
	t.add(rateRow(sec, fmt.Sprintf("100 B, %d light threads vs %d goroutines: throughput", p.conc, p.conc), p.parN, l, g).withTarget("≥ 0.9"))
	return nil
}
