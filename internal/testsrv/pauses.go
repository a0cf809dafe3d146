package testsrv

import "time"

// Pauses measures how late this machine wakes a sleeper (the longest
// oversleep of a 5 ms sleep) while a test's load runs. On a loaded
// machine every process may be descheduled for a while, and a timing bound
// that does not add that fails for the machine, not for the code.
type Pauses struct {
	stop chan struct{}
	out  chan time.Duration
}

// ProbePauses starts measuring; End stops and returns the longest pause.
func ProbePauses() *Pauses {
	p := &Pauses{stop: make(chan struct{}), out: make(chan time.Duration, 1)}
	go func() {
		worst := time.Duration(0)
		for {
			select {
			case <-p.stop:
				p.out <- worst
				return
			default:
			}
			b := time.Now()
			time.Sleep(5 * time.Millisecond)
			worst = max(worst, time.Since(b)-5*time.Millisecond)
		}
	}()
	return p
}

// End stops the probe and returns the longest pause it saw.
func (p *Pauses) End() time.Duration {
	close(p.stop)
	return <-p.out
}
