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
// completions, held back by the cap, fell behind the arrivals.
func TestSlowerMixNeverRefused(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
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
		t.Logf("seed %d: refused %d of %d, p99 %v", seed, refused, refused+served, p99)
		if refused != 0 {
			t.Errorf("seed %d: %d of %d refused, want none (nothing is overloaded)", seed, refused, refused+served)
		}
		// The slow ones take up to 300 ms; those that waited in the
		// suspect phase while its cap grew, up to 650 ms (seed 2).
		if p99 > time.Second {
			t.Errorf("seed %d: p99 %v, want <= 1s (the slow ones take up to 300 ms, the deadline is 2 s)", seed, p99)
		}
	}
}
