package admission

import (
	"testing"
	"time"
)

// A closed loop whose callers leave at their deadline and send again at
// once (ghz with a deadline), at the edge of what the server can serve
// in time: 512 callers, 60 ms deadlines, a 20 ms wait and then a share
// of two cores (the bench's slow scenario, "payment waits 20 ms", in
// miniature). Its arrivals follow its answers and its leaving, so the
// limiter must be silent: refuse no one, hold no one until their caller
// leaves, and serve as many in time as the server does without it (at
// 250 µs of CPU a request, about 80 % of them; at 400 µs, about 25 %).
// The bench's chain lost up to a third of its successes at this edge to
// its CPU, and at times to requests held until their callers left; this
// is the limiter's part, alone.
func TestLeavingCallersAtTheEdge(t *testing.T) {
	for _, cpu := range []time.Duration{250 * time.Microsecond, 400 * time.Microsecond} {
		for seed := range uint64(2) {
			inTime := func(off bool) (ok, all, refused, gone int) {
				s := newSim(t, Config{}, 2, cpu, seed)
				s.service = exponential(cpu)
				s.wait = 20 * time.Millisecond
				s.leave, s.late, s.off = true, true, off
				s.closedRamp(512, 0, 60*time.Millisecond, 3*time.Second, 60*time.Millisecond)
				s.run(4 * time.Second)
				ok, all = s.inTime(0, 3*time.Second)
				for _, r := range s.results {
					switch {
					case r.refused:
						refused++
					case r.gone:
						gone++
					}
				}
				return ok, all, refused, gone
			}
			offOK, offAll, _, _ := inTime(true)
			ok, all, refused, gone := inTime(false)
			offShare, share := float64(offOK)/float64(offAll), float64(ok)/float64(all)
			t.Logf("cpu %v seed %d: %.1f %% in time (no limiter %.1f %%), %d refused, %d left while held", cpu, seed, 100*share, 100*offShare, refused, gone)
			if refused+gone > 0 {
				t.Errorf("cpu %v seed %d: %d refused and %d held until their callers left, want none", cpu, seed, refused, gone)
			}
			if share < offShare-0.01 {
				t.Errorf("cpu %v seed %d: %.1f %% served in time, want at least the %.1f %% without a limiter, less a point", cpu, seed, 100*share, 100*offShare)
			}
		}
	}
}
