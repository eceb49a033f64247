package admission

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// A server that waits (no pool: any number in flight) serves 50 fast
// requests a second (3-6 ms); for 5 s, 128 or 192 slow ones a second
// (100-300 ms, healthy: a report, a batch) come on top, 2 s deadlines.
// Nothing is overloaded: 26 or 38 or so in flight serve them all. A
// user's trial: a middle tier refused 42-84 % of both kinds in 7 of 10
// runs, the suspect phase's cap held at what the fast mix needed and its
// completions, held back by the cap, fell behind the arrivals. The cap
// grew while the server served its fast requests within the base
// (roomFor), but few of them get a slot among the slow ones: 14 of
// these 100 seeds still refused at 192 a second and 5 at 128 (the review
// grid: 40 and 7 of 200), up to 72 % of their requests. Now the cap also
// grows where the server completes less than a quarter of what one slot
// would at the base (slowerWork), and on while the requests let in since
// it grew are served no slower than those before: 0 of 100 seeds refuse at either
// rate (the grid: 1 of 200 at 192, a phase that ran out 22 waiters
// short), and what is served is served within the deadline.
func TestSlowerMixNeverRefused(t *testing.T) {
	const seeds, mostRefusing = 100, 1
	for _, slowRate := range []float64{128, 192} {
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
			s.open(slowRate, 4*time.Second, 9*time.Second, 2*time.Second)
			s.at(4*time.Second, func() { slowShare = slowRate / (50 + slowRate) })
			s.at(9*time.Second, func() { slowShare = 0 })
			s.run(15 * time.Second)
			refused, served, p99 := s.in(0, 12*time.Second)
			if refused != 0 {
				refusing++
				t.Logf("%v slow a second, seed %d: %d of %d refused", slowRate, seed, refused, refused+served)
				continue
			}
			if p99 >= 2*time.Second {
				t.Errorf("%v slow a second, seed %d: p99 %v, want within the 2 s deadline", slowRate, seed, p99)
			}
		}
		if refusing > mostRefusing {
			t.Errorf("%v slow a second: %d of %d seeds refused requests, want at most %d (nothing is overloaded)", slowRate, refusing, seeds, mostRefusing)
		}
	}
}

// A pool of one worker whose service becomes 8 times slower (5 ms to 40
// ms: a query that got slower) meets twice what it can then serve, 1 s
// deadlines. Its base is the 5 ms of before, so a slot's completions
// come eight base latencies apart, as a waiting server's slow requests'
// do (TestSlowerMixNeverRefused), and the suspect cap grows once; but
// what it then lets in waits in the pool's queue, served slower than
// what came before, and the cap grows no more. Grown on that evidence
// alone, every window, the cap let the queue grow: most in flight 43-100
// where the cap was 5-10 when suspect, and p99 1.6-2.3 s in 6 of 8
// seeds (a median over 1.7 s); the limiter before slower work grew the
// cap: 1.24-1.43 s (its own known limit: a pool that becomes slower
// during an overload is served past the deadline).
func TestSlowerPoolGrowsItsCapOnce(t *testing.T) {
	const seeds = 8
	var p99s []time.Duration
	for seed := uint64(1); seed <= seeds; seed++ {
		s := newSim(t, Config{}, 1, 5*time.Millisecond, seed)
		s.service = func(*rand.Rand) time.Duration {
			if s.el >= time.Second {
				return 40 * time.Millisecond
			}
			return 5 * time.Millisecond
		}
		s.open(100, 0, time.Second, time.Second)
		s.open(50, time.Second, 4*time.Second, time.Second)
		s.run(5 * time.Second)
		_, served, p99 := s.in(time.Second, 4*time.Second)
		t.Logf("seed %d: %d served, p99 %v", seed, served, p99)
		p99s = append(p99s, p99)
	}
	slices.Sort(p99s)
	if med := p99s[seeds/2]; med > 1500*time.Millisecond {
		t.Errorf("median p99 over %d seeds %v, want at most 1.5 s (the cap grew into the queue)", seeds, med)
	}
}
