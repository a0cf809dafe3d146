package main

// IPC alone (no network): Lua → library → Lua through the built-in host,
// against the same Lua loop over a cosocket to a Go unix-socket echo.

import (
	"fmt"
	"log"
)

const secIPC = "IPC alone (no network)"

func figureIPC(e *env, p params, t *table) error {
	for _, size := range p.sizes {
		seq := p.ipcSeqN
		if size > 64<<10 {
			// The cosocket baseline takes about 130 µs a 100 KB call: at
			// the full count its three runs were 40 s of the full run,
			// for a ratio far from its target.
			seq /= 2
		}
		log.Printf("ipc %s sequential", sizeName(size))
		q, u, err := pair(p.runs,
			e.nginx.measure("ipc", seq, size, 1),
			e.nginx.measure("uds", seq, size, 1))
		if err != nil {
			return err
		}
		r := timeRow(secIPC, fmt.Sprintf("%s, %d sequential calls: time", sizeName(size), seq), q, u)
		switch size {
		case 512:
			r = r.withTarget("≤ 0.5")
		case 102400:
			r = r.withTarget("≤ 0.3")
		}
		t.add(r)
		calls := p.ipcParN
		if size > 64<<10 {
			calls /= 2 // what keeps the full run under ten minutes
		}
		log.Printf("ipc %s, %d light threads", sizeName(size), p.conc)
		q, u, err = pair(p.runs,
			e.nginx.measure("ipc", calls, size, p.conc),
			e.nginx.measure("uds", calls, size, p.conc))
		if err != nil {
			return err
		}
		t.add(rateRow(secIPC, fmt.Sprintf("%s, %d light threads (%d calls): throughput", sizeName(size), p.conc, calls), calls, q, u))
	}
	return nil
}
