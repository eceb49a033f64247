package admission

import (
	"math/rand/v2"
	"testing"
	"time"
)

// A server that waits (no pool: any number in flight) serves 50 fast
// requests a second (3-6 ms); for 5 s, 128 slow ones a second (100-300
// ms, healthy: a report, a batch) come on top, 2 s deadlines. Nothing is
// overloaded: 26 or so in flight serve them all. A user's trial: a
// middle tier refused 42-84 % of both kinds in 7 of 10 runs, the
// suspect phase's cap held at what the fast mix needed and its
// completions, held back by the cap, fell behind the arrivals. Now the
// cap grows while the server serves its fast requests fast (roomFor):
// in 95 of 100 seeds nothing is refused (in 5 the cap still grows too
// late, a known limit; 3 while the simulator fired a timer only at its
// next event, with the same library), and what is served is served
// within the deadline (p99 up to 1.42 s while the cap grows).
func TestSlowerMixNeverRefused(t *testing.T) {
	const seeds, mostRefusing = 100, 5
	refusing := 0
	for seed := uint64(1); seed <= seeds; seed++ {
		s := newSim(t, Config{}, 1<<20, 0, seed)
		slowShare := 0.0
		s.service = func(r *rand.Rand) time.Duration {
			if r.Float64() < slowShare {
				return 100*time.Millisecond + time.Duration(r.Float64()*float64(200*time.Millisecond))
			}
			return 3*time.Millisecond + time.Duration(r.Float64()*float64(3*time.Millisecond))
		}
		s.open(50, 0, 12*time.Second, 2*time.Second)
		s.open(128, 4*time.Second, 9*time.Second, 2*time.Second)
		s.at(4*time.Second, func() { slowShare = 128.0 / 178 })
		s.at(9*time.Second, func() { slowShare = 0 })
		s.run(15 * time.Second)
		refused, served, p99 := s.in(0, 12*time.Second)
		if refused != 0 {
			refusing++
			t.Logf("seed %d: %d of %d refused", seed, refused, refused+served)
			continue
		}
		if p99 >= 2*time.Second {
			t.Errorf("seed %d: p99 %v, want within the 2 s deadline", seed, p99)
		}
	}
	if refusing > mostRefusing {
		t.Errorf("%d of %d seeds refused requests, want at most %d (nothing is overloaded)", refusing, seeds, mostRefusing)
	}
}
