package admission

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// A closed loop of callers never overloads a server, at any number of
// callers and however long the latency: zero refusals (issue "Busy is not
// broken", review finding 1 and 5: a limit from latency refused 56 % to
// 95 % of a closed loop, and cold starts 85 % of the first 250 ms).
func TestClosedLoopNeverRefused(t *testing.T) {
	for _, n := range []int{1, 8, 32, 128, 512, 2048} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			s := newSim(t, Config{}, 8, time.Millisecond, 1) // 8 000 requests/s
			s.closed(n, 0, 3*time.Second)
			s.run(3 * time.Second)
			refused, served, _ := s.in(0, 3*time.Second)
			if refused != 0 || s.l.Stats().RejectedOverload != 0 {
				t.Errorf("%d callers: %d refused of %d", n, refused, refused+served)
			}
			// Each caller waits 100 µs between an answer and its next
			// request.
			capacity := min(8000, float64(n)/1.1e-3)
			if want := 0.95 * capacity * 3; float64(served) < want {
				t.Errorf("%d callers: %d served, want >= %.0f (what the pool and the callers allow)", n, served, want)
			}
		})
	}
}

// A closed loop whose requests are sometimes much slower (a middle tier
// whose dependency is slow at times, or that retries with backoff) is not
// overloaded either.
func TestClosedLoopSlowTailNeverRefused(t *testing.T) {
	for _, share := range []float64{0.01, 0.1, 0.5} {
		t.Run(fmt.Sprint(share), func(t *testing.T) {
			s := newSim(t, Config{}, 1000, time.Millisecond, 2) // waiting, not working
			s.service = func(r *rand.Rand) time.Duration {
				if r.Float64() < share {
					return 200 * time.Millisecond
				}
				return time.Millisecond
			}
			s.closed(256, 0, 3*time.Second)
			s.run(3 * time.Second)
			if refused, served, _ := s.in(0, 3*time.Second); refused != 0 {
				t.Errorf("%.0f %% slow: %d refused of %d", 100*share, refused, refused+served)
			}
		})
	}
}

// Open-loop arrivals above capacity, after a second of healthy traffic,
// overload the server: it refuses what would wait longer than the target,
// keeps serving at capacity with a short queue, and stops refusing as
// soon as the overload ends.
func TestOpenLoopOverload(t *testing.T) {
	const capacity = 8000.0 // 8 workers, 1 ms each
	for _, factor := range []float64{1.5, 2, 4, 8} {
		t.Run(fmt.Sprint(factor), func(t *testing.T) {
			s := newSim(t, Config{}, 8, time.Millisecond, 3)
			s.open(0.5*capacity, 0, time.Second, time.Second)
			s.open(factor*capacity, time.Second, 3*time.Second, time.Second)
			s.open(0.5*capacity, 3*time.Second, 4*time.Second, time.Second)
			s.run(4 * time.Second)
			for from := time.Duration(0); from < 4*time.Second; from += 250 * time.Millisecond {
				refused, served, p99 := s.in(from, from+250*time.Millisecond)
				t.Logf("%v: refused %d served %d p99 %v", from, refused, served, p99)
			}
			if refused, _, _ := s.in(0, time.Second); refused != 0 {
				t.Errorf("%.1fx: %d refused in the healthy second before", factor, refused)
			}
			_, served, p99 := s.in(1250*time.Millisecond, 3*time.Second)
			if rate := float64(served) / 1.75; rate < 0.9*capacity {
				t.Errorf("%.1fx: served %.0f/s during the overload, want >= 0.9 x %.0f", factor, rate, capacity)
			}
			// Not more: a base that followed the latency of the server's
			// own queue drifted to 8 times its 1 ms (p99 28 ms).
			if p99 > 24*time.Millisecond {
				t.Errorf("%.1fx: p99 %v during the overload, want <= 24ms (1 ms service + 20 ms target + 3)", factor, p99)
			}
			if refused, _, _ := s.in(3100*time.Millisecond, 4*time.Second); refused != 0 {
				t.Errorf("%.1fx: %d refused from 100 ms after the overload", factor, refused)
			}
		})
	}
}

// An open-loop overload that meets a server cold (one request before)
// whose windows hold fewer than minSamples successes (2 workers, 8 ms
// each): the limiter takes the mean of the successes it has seen as its
// base once it has minSamples of them. Before, no window ever had a mean
// while overloaded, and the p99 of the whole overload was 266 ms.
func TestColdOpenLoopOverload(t *testing.T) {
	const capacity = 250.0
	for _, factor := range []float64{2, 8} {
		t.Run(fmt.Sprint(factor), func(t *testing.T) {
			s := newSim(t, Config{}, 2, 8*time.Millisecond, 5)
			s.open(1, 0, 2*time.Millisecond, time.Second) // the warm-up: one request
			s.open(factor*capacity, time.Second, 6*time.Second, time.Second)
			s.run(6 * time.Second)
			for from := time.Second; from < 2*time.Second; from += 100 * time.Millisecond {
				refused, served, p99 := s.in(from, from+100*time.Millisecond)
				t.Logf("%v: refused %d served %d p99 %v", from, refused, served, p99)
			}
			_, served, p99 := s.in(time.Second, 6*time.Second)
			if rate := float64(served) / 5; rate < 0.9*capacity {
				t.Errorf("%.0fx: served %.0f/s, want >= 0.9 x %.0f", factor, rate, capacity)
			}
			// The first half second is the cold start's: the requests
			// admitted before minSamples successes came back.
			if p99 > 150*time.Millisecond {
				t.Errorf("%.0fx: p99 %v over the overload, want <= 150ms", factor, p99)
			}
			if _, _, p99 := s.in(1500*time.Millisecond, 6*time.Second); p99 > 60*time.Millisecond {
				t.Errorf("%.0fx: p99 %v after its first half second, want <= 60ms", factor, p99)
			}
		})
	}
}

// A closed loop that meets an overload (here one that an open-loop burst
// caused) is refused, sends again at once, and so keeps its refused
// arrivals above the completions: it looks overloaded for good. The
// probe, which holds refusals for a moment, sees its arrivals pause with
// them, and ends the overload.
func TestClosedLoopLeavesOverload(t *testing.T) {
	s := newSim(t, Config{}, 8, time.Millisecond, 4)
	s.open(4*8000, 0, 500*time.Millisecond, time.Second)
	s.closed(512, 400*time.Millisecond, 4*time.Second)
	s.run(4 * time.Second)
	for from := time.Duration(0); from < 4*time.Second; from += 250 * time.Millisecond {
		refused, served, p99 := s.in(from, from+250*time.Millisecond)
		t.Logf("%v: refused %d served %d p99 %v", from, refused, served, p99)
	}
	if refused, _, _ := s.in(250*time.Millisecond, 500*time.Millisecond); refused == 0 {
		t.Fatal("the open-loop burst was not refused: the test shows nothing")
	}
	if refused, served, _ := s.in(1500*time.Millisecond, 4*time.Second); refused != 0 {
		t.Errorf("%d of %d refused from 1 s after the burst: the closed loop is stuck in overload", refused, refused+served)
	}
}

// Streams started in a burst (a thousand watchers connecting) are
// admitted and released at once as Ignored: they count as neither
// arrivals nor completions, so they never make a server overloaded.
func TestIgnoredStartsNoOverload(t *testing.T) {
	s := newSim(t, Config{}, 8, time.Millisecond, 9)
	s.closed(64, 0, time.Second)
	for w := range 20 {
		s.at(time.Duration(w)*10*time.Millisecond, func() {
			for range 200 {
				p, err := s.l.Acquire(ClassFirst, time.Time{})
				if err != nil {
					t.Errorf("stream start refused: %v", err)
					return
				}
				p.Release(Ignored)
			}
		})
	}
	s.run(time.Second)
	if refused, served, _ := s.in(0, time.Second); refused != 0 || s.l.Stats().Overloaded {
		t.Errorf("with 4 000 stream starts: %d of %d refused, overloaded %v", refused, refused+served, s.l.Overloaded())
	}
}

// slowWhen is a service time of fast, slower while *slow.
func slowWhen(slow *bool, fast, slower time.Duration) func(*rand.Rand) time.Duration {
	return func(*rand.Rand) time.Duration {
		if *slow {
			return slower
		}
		return fast
	}
}

// A server that becomes several times slower (not queued) under open-loop
// load keeps its workers busy: the base follows its latency without a
// queue while it is overloaded (up to 8 times the base of before), so
// that the requests its idle workers could serve are not refused.
func TestSlowerServerKeepsWorkersBusy(t *testing.T) {
	s := newSim(t, Config{}, 4, 10*time.Millisecond, 10) // 400/s, then 80/s
	slow := false
	s.service = slowWhen(&slow, 10*time.Millisecond, 50*time.Millisecond)
	s.open(240, 0, 4*time.Second, 500*time.Millisecond)
	s.run(time.Second)
	slow = true
	s.run(3 * time.Second)
	slow = false
	s.run(4 * time.Second)
	for from := time.Duration(0); from < 4*time.Second; from += 250 * time.Millisecond {
		refused, served, p99 := s.in(from, from+250*time.Millisecond)
		t.Logf("%v: refused %d served %d p99 %v", from, refused, served, p99)
	}
	_, served, p99 := s.in(1250*time.Millisecond, 3*time.Second)
	t.Logf("slow: served %d (%.0f %% of 80/s), p99 %v", served, 100*float64(served)/1.75/80, p99)
	if rate := float64(served) / 1.75; rate < 0.8*80 {
		t.Errorf("served %.0f/s while 5x slower, want >= 80 %% of its 80/s", rate)
	}
	// The requests in flight when it slowed down keep their place (a
	// suspect server holds only what arrives after), and 15 of them wait
	// behind 4 workers now five times slower.
	if p99 > 400*time.Millisecond {
		t.Errorf("p99 %v while 5x slower, want <= 400ms", p99)
	}
	if refused, _, _ := s.in(3250*time.Millisecond, 4*time.Second); refused != 0 {
		t.Errorf("%d refused after the slowdown", refused)
	}
}

// A server that becomes slower while overloaded keeps its workers busy:
// the requests admitted at the thresholds of before take longer than any
// queue those allow, and the base follows the latency. Five times slower
// (10 -> 50 ms): without following, it served 61/s of its 80/s; the code
// before the judgement, which always followed, 80/s. Slower by less than
// one and a half targets (4 -> 30 ms, within the base plus 1.5 x 20 ms,
// where the judgement first drew its line): 39 % of its capacity with 4
// workers, 45 % with 16, as its thresholds of before admitted fewer
// requests than it had workers. 4 -> 20 and 4 -> 12 ms stay below the
// line of the base plus one target, and need no following.
func TestSlowerWhileOverloadedFollows(t *testing.T) {
	for _, tc := range []struct {
		workers    int
		fast, slow time.Duration
	}{
		{4, 10 * time.Millisecond, 50 * time.Millisecond},
		{4, 4 * time.Millisecond, 30 * time.Millisecond},
		{16, 4 * time.Millisecond, 30 * time.Millisecond},
		{4, 4 * time.Millisecond, 20 * time.Millisecond},
		{4, 4 * time.Millisecond, 12 * time.Millisecond},
	} {
		t.Run(fmt.Sprintf("%d workers %v to %v", tc.workers, tc.fast, tc.slow), func(t *testing.T) {
			s := newSim(t, Config{}, tc.workers, tc.fast, 11)
			capacity := float64(tc.workers) / tc.fast.Seconds()
			slowCapacity := float64(tc.workers) / tc.slow.Seconds()
			slow := false
			s.service = slowWhen(&slow, tc.fast, tc.slow)
			s.excess(capacity, 0.5, time.Second, 4*time.Second, 5*time.Second)
			s.run(2 * time.Second)
			if !s.l.Overloaded() {
				t.Fatal("not overloaded at 2x its capacity")
			}
			slow = true
			s.run(3 * time.Second)
			slow = false
			s.run(5 * time.Second)
			done := 0
			for _, r := range s.results {
				if end := r.at + r.latency; !r.refused && !r.gone && end >= 2250*time.Millisecond && end < 3*time.Second {
					done++
				}
			}
			rate := float64(done) / 0.75
			t.Logf("served %.0f/s while slower (%.0f %% of %.0f/s)", rate, 100*rate/slowCapacity, slowCapacity)
			if rate < 0.85*slowCapacity {
				t.Errorf("served %.0f/s while slower and overloaded, want >= 85 %% of its %.0f/s", rate, slowCapacity)
			}
			if refused, _, _ := s.in(4100*time.Millisecond, 5*time.Second); refused != 0 {
				t.Errorf("%d refused from 100 ms after the overload", refused)
			}
		})
	}
}

// A closed loop whose callers start one after the other over 100 ms (ghz
// -c 512 over TCP takes about 60 ms to get its callers in flight) keeps
// arrivals above completions for longer than a window: the server is
// suspect, queues rather than refuses, and is calm again once the ramp
// is over. Zero refusals, with and without short deadlines, at a server
// that computes (a pool of 8 workers) and one that waits (20 ms).
func TestClosedLoopRampNeverRefused(t *testing.T) {
	for _, tc := range []struct {
		name     string
		workers  int
		service  time.Duration
		callers  int
		deadline time.Duration
		cold     bool          // no warm-up: the ramp is the server's first load
		ramp     time.Duration // 0: 100 ms
	}{
		{"pool, no deadline", 8, time.Millisecond, 512, 0, false, 0},
		{"pool, 1 s deadline", 8, time.Millisecond, 512, time.Second, false, 0},
		{"waiting 20 ms, 60 ms deadline", 10000, 20 * time.Millisecond, 128, 60 * time.Millisecond, false, 0},
		{"waiting 20 ms, no deadline", 10000, 20 * time.Millisecond, 512, 0, false, 0},
		{"cold, waiting 20 ms, 60 ms deadline", 10000, 20 * time.Millisecond, 128, 60 * time.Millisecond, true, 0},
		{"cold, pool, 1 s deadline", 8, time.Millisecond, 512, time.Second, true, 0},
		// 64 ms at capacity: deadlines a little above it, callers that
		// start faster. A suspect phase that held them two windows
		// longer (calm over four windows, tried) refused 1.7 million.
		// (With 70 ms deadlines 3 of 21 816 time out waiting.)
		{"pool, 80 ms deadline, 60 ms ramp", 8, time.Millisecond, 512, 80 * time.Millisecond, false, 60 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, Config{}, tc.workers, tc.service, 11)
			s.late = true // as the interceptor releases a late answer
			ramp := tc.ramp
			if ramp == 0 {
				ramp = 100 * time.Millisecond
			}
			if !tc.cold {
				s.closedRamp(4, 0, 0, 3*time.Second, tc.deadline) // the warm-up
			} else {
				// A busy machine's latency: up to twice the service time,
				// beyond the Target on its own.
				s.service = func(r *rand.Rand) time.Duration {
					return tc.service + time.Duration(r.Int64N(int64(tc.service)))
				}
			}
			s.run(500 * time.Millisecond)
			s.closedRamp(tc.callers, 500*time.Millisecond, ramp, 3*time.Second, tc.deadline)
			s.run(3 * time.Second)
			refused, served, p99 := s.in(0, 3*time.Second)
			gone := 0
			for _, r := range s.results {
				if r.gone {
					gone++
				}
			}
			t.Logf("refused %d gone %d served %d p99 %v", refused, gone, served, p99)
			if refused != 0 {
				t.Errorf("%d of %d refused", refused, refused+served)
			}
			// A waiter near its deadline goes in while the server serves
			// in time: none of a ramp times out in the limiter.
			if gone != 0 {
				t.Errorf("%d of %d timed out waiting in the limiter", gone, served)
			}
		})
	}
}

// A dependency that goes down behind a server that holds its requests
// for a while before failing them (a client waiting for its target to
// come back) makes arrivals exceed completions for that long, at an open
// loop's rate, as an overload would. But nothing succeeds: the server is
// failing, not busy, and holding its callers in the limiter would only
// delay their failure, or send them all at once when the dependency is
// back. No request waits in the limiter for longer than it takes the
// first failures to come back (one hold; a window without completions
// is a slow server's too), where the limiter held them for 550 ms more,
// and nothing is refused.
func TestFailingServerHoldsNoOne(t *testing.T) {
	s := newSim(t, Config{}, 10000, 5*time.Millisecond, 12)
	down := false
	s.fail = func() (bool, time.Duration) { return down, 250 * time.Millisecond }
	s.open(100, 0, 2500*time.Millisecond, time.Second)
	s.run(500 * time.Millisecond)
	down = true
	s.run(2 * time.Second)
	down = false
	s.run(3 * time.Second)
	refused, _, _ := s.in(0, 3*time.Second)
	var longest time.Duration
	for _, r := range s.results {
		if r.at >= 500*time.Millisecond && r.at < 2*time.Second {
			longest = max(longest, r.latency)
		}
		if r.gone {
			t.Errorf("a request of %v timed out waiting in the limiter", r.at)
		}
	}
	t.Logf("refused %d, longest while down %v", refused, longest)
	if refused != 0 {
		t.Errorf("%d refused", refused)
	}
	if longest > 550*time.Millisecond {
		t.Errorf("a request took %v while down, want at most two holds of 250 ms: it waited in the limiter", longest)
	}
}

// A server whose requests hang (every handler waits for a dependency
// that answers nothing, until its caller's 1 s deadline) after a second
// of healthy open-loop traffic: arrivals exceed completions, and none
// completes for a second. The requests it parks while suspect must not
// all go in when it becomes overloaded: before, the overload rule
// admitted every request while nothing had completed lately ("nothing to
// expect"), so a second's arrivals went into the hang at once (payment
// hangs, bench hang-after-healthy: 165 to 229 calls at payment in 50 ms).
func TestHangAdmitsNoBacklog(t *testing.T) {
	// Goroutines, not workers; each request waits 30 ms for a dependency,
	// which from 1 s answers half of them, and from 1.1 s none: the
	// handlers fail at their callers' deadline.
	s := newSim(t, Config{}, 1<<20, 30*time.Millisecond, 5)
	s.fail = func() (bool, time.Duration) {
		return s.el >= 1300*time.Millisecond || s.el >= time.Second && s.rnd.Float64() < 0.5, time.Second
	}
	s.failAs = abandoned
	s.open(300, 0, 3*time.Second, time.Second)
	// The most admitted requests in flight at once, from 300 ms into the
	// hang (the server has held its arrivals for a while) until after
	// the first deadlines ran out.
	most := 0
	for d := 1300 * time.Millisecond; d < 2250*time.Millisecond; d += time.Millisecond {
		s.at(d, func() { most = max(most, s.busy) })
	}
	s.run(4500 * time.Millisecond) // until everything admitted has ended
	for from := time.Duration(0); from < 3*time.Second; from += 250 * time.Millisecond {
		refused, served, _ := s.in(from, from+250*time.Millisecond)
		t.Logf("%v: refused %d admitted %d", from, refused, served)
	}
	if refused, _, _ := s.in(0, time.Second); refused != 0 {
		t.Errorf("%d refused in the healthy second", refused)
	}
	t.Logf("most in flight from 300 ms into the hang to after its first deadlines: %d", most)
	if most > 60 {
		t.Errorf("%d requests in flight at once from 300 ms into the hang to after its first deadlines, want <= 60 (what it held when it became suspect, about 30, twice)", most)
	}
}

// Requests its callers left are no sign that a server keeps up. A server
// overloaded by open-loop arrivals at 8 times its capacity holds 600
// requests admitted before, waiting below it (a gateway whose requests
// wait at the tiers behind it), that end together at their callers'
// deadline, Abandoned: in those windows as many end as arrive. Counted as
// completions, they made the server look calm: the overload ended and a
// suspect phase held the arrivals again (a gateway at 8x went through it
// every second, p99 of successes 150-600 ms, its throttle below calling
// the next tier down). The overload holds until the arrivals fall.
func TestAbandonedWaveKeepsOverload(t *testing.T) {
	const capacity = 800.0 // 4 workers, 5 ms each
	s := newSim(t, Config{}, 4, 5*time.Millisecond, 5)
	s.open(0.5*capacity, 0, time.Second, time.Second)
	s.open(8*capacity, time.Second, 4*time.Second, time.Second)
	s.open(0.5*capacity, 4*time.Second, 5*time.Second, time.Second)
	var below []Permit
	s.at(time.Second-time.Millisecond, func() {
		for range 600 {
			p, err := s.l.Acquire(ClassFirst, time.Time{})
			if err != nil {
				t.Fatalf("Acquire before the overload: %v", err)
			}
			below = append(below, p)
		}
	})
	for i := range 30 { // their deadline: 20 a millisecond
		s.at(2*time.Second+time.Duration(i)*time.Millisecond, func() {
			for _, p := range below[20*i : 20*(i+1)] {
				p.Release(Abandoned)
			}
		})
	}
	var ends int
	was := false
	var sample func()
	sample = func() {
		o := s.l.Overloaded()
		if was && !o {
			ends++
		}
		was = o
		if s.el < 4*time.Second {
			s.at(s.el+time.Millisecond, sample)
		}
	}
	s.at(1500*time.Millisecond, sample)
	s.run(5 * time.Second)
	for from := time.Duration(0); from < 5*time.Second; from += 250 * time.Millisecond {
		refused, served, p99 := s.in(from, from+250*time.Millisecond)
		t.Logf("%v: refused %d served %d p99 %v", from, refused, served, p99)
	}
	if !was || ends != 0 {
		t.Errorf("overloaded at the end of the excess: %v, after %d ends of the overload while the arrivals were 8x the capacity; want true after none", was, ends)
	}
	if refused, _, _ := s.in(4100*time.Millisecond, 5*time.Second); refused != 0 {
		t.Errorf("%d refused from 100 ms after the overload", refused)
	}
}

// A steady share of requests whose callers leave while they run (here
// 40 %, cancelled as they end) is no wave: once the overload ends, the
// arrivals are below what the server completes, and it is calm. Counting
// only what it served while overloaded (as for the wave above, 93eedd2),
// the arrivals, as many as the completions, stayed above the 60 % of
// them that were served: the overload never ended by calm, and held
// every request to the thresholds of an overload for good.
func TestSteadyAbandonedShareEndsOverload(t *testing.T) {
	const capacity = 3200.0 // 16 workers, 5 ms each
	s := newSim(t, Config{}, 16, 5*time.Millisecond, 6)
	s.fail = func() (bool, time.Duration) { return s.rnd.Float64() < 0.4, 5 * time.Millisecond }
	s.failAs = abandoned
	s.excess(capacity, 0.7, time.Second, 2*time.Second, 4*time.Second)
	s.run(1500 * time.Millisecond)
	if !s.l.Overloaded() {
		t.Fatal("not overloaded at 2x its capacity: the test shows nothing")
	}
	var over time.Duration // overloaded, from 500 ms after the overload
	for d := 2500 * time.Millisecond; d < 4*time.Second; d += time.Millisecond {
		s.at(d, func() {
			if s.l.Overloaded() {
				over += time.Millisecond
			}
		})
	}
	s.run(4 * time.Second)
	for from := time.Duration(0); from < 4*time.Second; from += 500 * time.Millisecond {
		refused, served, p99 := s.in(from, from+500*time.Millisecond)
		t.Logf("%v: refused %d served %d p99 %v", from, refused, served, p99)
	}
	if refused, _, _ := s.in(0, time.Second); refused != 0 {
		t.Errorf("%d refused in the healthy second before", refused)
	}
	refused, _, _ := s.in(2500*time.Millisecond, 4*time.Second)
	if refused != 0 || over != 0 {
		t.Errorf("from 500 ms after the overload: %d refused, overloaded for %v of 1.5s; want none, 0s", refused, over)
	}
}

// A pool that serves what it admitted even after the caller left (four
// workers, a FIFO queue that ignores cancellation, 10 ms per request),
// loaded at 240/s by callers that wait 150 ms (the per-attempt timeout
// of the tier above), becomes five times slower for a second (80/s).
// While suspect, the server keeps at most the concurrency it had when it
// became suspect; when that is more than the slower pool serves within
// its callers' wait, every request it admits is served after its caller
// left (released Abandoned, as the interceptor does), and the pool
// serves no one in time until the slowdown ends. The cap gives up the
// slots that served no one.
func TestSuspectCapGivesUpAbandonedSlots(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4, 5, 6} {
		s := newSim(t, Config{}, 4, 10*time.Millisecond, seed)
		s.late = true
		s.service = func(*rand.Rand) time.Duration {
			if s.el >= time.Second && s.el < 2*time.Second {
				return 50 * time.Millisecond
			}
			return 10 * time.Millisecond
		}
		s.open(240, 0, 3*time.Second, 150*time.Millisecond)
		s.run(3500 * time.Millisecond)
		inTime := 0
		for _, r := range s.results {
			if r.at >= 1200*time.Millisecond && r.at < 2*time.Second && !r.refused && !r.gone && r.latency < 150*time.Millisecond {
				inTime++
			}
		}
		// 80/s for the 800 ms from 1.2 s (its requests are served by 2.05 s).
		t.Logf("seed %d: served in time %d of the slow pool's 64", seed, inTime)
		if inTime < 44 {
			t.Errorf("seed %d: served in time %d of the slow pool's 64, want at least 44", seed, inTime)
		}
	}
}

// A gateway in front of a pool that became five times slower (80/s for
// 240/s) is suspect, and then its calls below time out (the pool's queue
// grew past its callers' wait), a few failing fast (a throttle below
// refuses them): windows that served no one, most of their completions
// Abandoned, some Failed. That is a server whose callers give up, not one
// that fails: it must not let in everything it holds at once. It did
// when one window's completions were all unsuccessful (five of six
// seeds), and sent a hundred held requests into the queue the others had
// timed out in.
func TestSuspectHoldsWhenCallsBelowTimeOut(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4, 5, 6} {
		s := newSim(t, Config{}, 4, 10*time.Millisecond, seed)
		s.service = func(*rand.Rand) time.Duration {
			if s.el >= time.Second {
				return 50 * time.Millisecond
			}
			return 10 * time.Millisecond
		}
		s.fail = func() (bool, time.Duration) {
			switch {
			case s.el < 1100*time.Millisecond:
				return false, 0
			case s.rnd.Float64() < 0.05:
				return true, 2 * time.Millisecond // refused below at once
			}
			return true, 50 * time.Millisecond // its call below timed out
		}
		s.failAs = func(took time.Duration) Outcome {
			if took < 50*time.Millisecond {
				return Failed
			}
			return Abandoned
		}
		s.open(240, 0, 2*time.Second, time.Second)
		suspectAt, most := 0, 0
		for d := time.Second; d < 2*time.Second; d += time.Millisecond {
			s.at(d, func() {
				if suspectAt == 0 && s.l.suspect.Load() {
					suspectAt = int(s.l.suspectCap.Load())
				}
				if s.el >= 1200*time.Millisecond {
					most = max(most, s.busy+len(s.queue))
				}
			})
		}
		s.run(3 * time.Second)
		t.Logf("seed %d: cap %d when suspect, most in flight %d", seed, suspectAt, most)
		if suspectAt == 0 {
			t.Fatalf("seed %d: never suspect: the test tests nothing", seed)
		}
		if most > 2*suspectAt {
			t.Errorf("seed %d: %d in flight at once, more than twice the cap of %d when suspect: it let in what it held", seed, most, suspectAt)
		}
	}
}

// A cold server whose service times vary (exponential, 50 ms mean, 4
// workers: 80/s) meets an open loop at 2x: its first successes are its
// fastest, and a base taken from them alone refuses what its workers
// could serve. Also with a warm-up success of 0.5 ms (a cheap method).
// What it serves must be served in time: before, this test counted
// answers given after their callers' deadlines too (one seed), and
// passed where the suspect phase ended calm by chance again and again
// and the handler's queue grew past the deadlines, no overload ever
// declared (p99 of what it served 1.5-3.4 s in 13 of these 16 runs; see
// TestSpreadOverloadIsDeclared). Declared, the rule kept the workers
// idle at the base of the first answers (0.41-0.84x of capacity in
// time, 0.64x on average without a warm-up) until a request that finds
// nothing in flight went in (it waits behind no one) and the mean of
// those requests' latencies became the base (freeMean).
func TestColdOverloadVariedService(t *testing.T) {
	const capacity, seeds = 80.0, 8
	for _, fastWarmUp := range []bool{false, true} {
		t.Run(fmt.Sprint("fast warm-up ", fastWarmUp), func(t *testing.T) {
			inTime := 0
			for seed := uint64(1); seed <= seeds; seed++ {
				s := newSim(t, Config{}, 4, 50*time.Millisecond, seed)
				s.service = func(r *rand.Rand) time.Duration {
					if fastWarmUp && s.el < time.Second {
						return 500 * time.Microsecond
					}
					return exponential(50 * time.Millisecond)(r)
				}
				s.late = true
				s.open(1, 0, 2*time.Millisecond, time.Second) // the warm-up: one request
				s.open(2*capacity, time.Second, 6*time.Second, time.Second)
				s.run(7 * time.Second)
				ok, _ := s.inTime(time.Second, 6*time.Second)
				_, _, p99 := s.in(time.Second, 6*time.Second)
				t.Logf("seed %d: served in time %.0f/s, p99 %v, base %v", seed, float64(ok)/5, p99, s.l.Stats().Base)
				if p99 >= time.Second {
					t.Errorf("seed %d: p99 of what it served %v, want within the 1 s deadline", seed, p99)
				}
				inTime += ok
			}
			if rate := float64(inTime) / seeds / 5; rate < 0.75*capacity {
				t.Errorf("served in time %.0f/s on average, want >= 0.75 x %.0f", rate, capacity)
			}
		})
	}
}

// A pool whose hold spreads (16 workers of 50 ms on average,
// exponential: 320/s) meets an open loop at twice its capacity after
// healthy traffic at half of it, 1 s deadlines. A window holds a few
// events (3 or 4 completions), and the tests of calm over two windows
// passed by chance now and then; each calm end let the waiters in, the
// next suspect phase took all of them in flight as its cap, and the
// handler's queue grew to the callers' deadlines without an overload
// ever being declared: 7 of these 16 seeds served with a p99 of 1 s
// (what waited until its caller left), down to 0.56x of capacity in
// time (busy's overload-spread over TCP: one run in five, 0.01-0.08x
// of capacity in its last second). The same with 64 workers of 300 ms
// (213/s): 0.17-0.82x in time, 4 of 6 seeds under 0.25x, and 48-59 % of
// the half load after it served in those 4. The tests of calm now span
// 64 events (calmSpanNow): 0.80-1.35x and 0.75-0.87x.
func TestSpreadOverloadIsDeclared(t *testing.T) {
	for _, c := range []struct {
		workers    int
		mean       time.Duration
		seeds      uint64
		warm, long time.Duration // the healthy traffic before, the overload
		least      float64       // of capacity served in time, its first half second aside
		after      float64       // served in time in the second after it
		inTime     bool          // the p99 of what it served is within the deadline
	}{
		{16, 50 * time.Millisecond, 16, time.Second, 3 * time.Second, 0.75, 0.9, true},
		// 4 of 6 seeds leave some waiters until their deadlines.
		{64, 300 * time.Millisecond, 6, 2 * time.Second, 6 * time.Second, 0.7, 0.85, false},
	} {
		t.Run(fmt.Sprint(c.workers, "x", c.mean), func(t *testing.T) {
			capacity := float64(c.workers) / c.mean.Seconds()
			from, to := c.warm, c.warm+c.long
			for seed := uint64(1); seed <= c.seeds; seed++ {
				s := newSim(t, Config{}, c.workers, c.mean, seed)
				s.service = exponential(c.mean)
				s.late, s.leave = true, true
				s.open(0.5*capacity, 0, from, time.Second)
				s.open(2*capacity, from, to, time.Second)
				s.open(0.5*capacity, to, to+time.Second, time.Second)
				s.run(to + 2*time.Second)
				ok, _ := s.inTime(from+time.Second/2, to)
				_, _, p99 := s.in(from, to)
				aok, aall := s.inTime(to, to+time.Second)
				rate := float64(ok) / (to - from - time.Second/2).Seconds()
				t.Logf("seed %d: in time %.0f/s (%.2fx), p99 %v; after %d of %d", seed, rate, rate/capacity, p99, aok, aall)
				if c.inTime && p99 >= time.Second {
					t.Errorf("seed %d: p99 %v in the overload, want within the 1 s deadline", seed, p99)
				}
				if rate < c.least*capacity {
					t.Errorf("seed %d: served in time %.0f/s in the overload, want >= %.2f x %.0f", seed, rate, c.least, capacity)
				}
				if float64(aok) < c.after*float64(aall) {
					t.Errorf("seed %d: %d of %d served in time after the overload, want >= %.0f %%", seed, aok, aall, 100*c.after)
				}
			}
		})
	}
}

// A server whose latencies spread (64 workers, each request holding one
// for 100 ms on average, exponentially distributed: a handler that waits
// on a database) meets an open-loop overload at twice its capacity after
// healthy traffic (callers at half of it). It must serve about its
// capacity during the overload and refuse nothing once the load is back
// at half. Before, the base was the least of the windows' mean
// latencies, a fraction of the mean where a window holds a few spread
// latencies: the overload rule's Little's-law estimate (a mean) stayed
// above base + target however few were admitted, and the server was
// admitted 101-128/s of its 640/s during the overload and refused 33-88 %
// of the half load after it, for good.
func TestSpreadLatencyOverloadEnds(t *testing.T) {
	const workers, mean = 64, 100 * time.Millisecond
	capacity := float64(workers) / mean.Seconds() // 640/s
	for seed := uint64(1); seed <= 4; seed++ {
		s := newSim(t, Config{}, workers, mean, seed)
		s.service = exponential(mean)
		s.closed(workers/2, 0, 4*time.Second) // about half the capacity
		s.open(2*capacity, 4*time.Second, 7*time.Second, time.Second)
		s.open(0.5*capacity, 7*time.Second, 13*time.Second, time.Second)
		s.run(15 * time.Second)
		if refused, served, _ := s.in(0, 4*time.Second); refused != 0 {
			t.Errorf("seed %d: %d of %d refused at half the capacity, before the overload", seed, refused, refused+served)
		}
		_, served, _ := s.in(4*time.Second, 7*time.Second)
		rate := float64(served) / 3
		if rate < 0.9*capacity {
			t.Errorf("seed %d: admitted %.0f/s during the overload, want >= 0.9x the capacity of %.0f/s", seed, rate, capacity)
		}
		refused, after, _ := s.in(8*time.Second, 13*time.Second)
		t.Logf("seed %d: admitted %.0f/s of %.0f/s during the overload; from 1 s after it, refused %d of %d", seed, rate, capacity, refused, refused+after)
		if refused != 0 {
			t.Errorf("seed %d: %d of %d refused from 1 s after the overload, at half the capacity", seed, refused, refused+after)
		}
	}
}

// A pool of 8 workers of 50 ms on average (exponential: 160/s) at half
// its capacity after an overload of four times it: the few requests a
// window that the rule admits make the time per completion long, the
// latency it expects long, and it refused more the more it refused;
// the refusals, counted as arrivals, kept every window from being calm.
// It refused 80-90 % of the half load for as long as it lasted after 4
// of these 24 overloads (and the bench's overload-spread scenario in
// about 1 of 4 runs). What is offered, refused requests included, well
// below the rate the server served at over the overload, with room in
// flight, now ends it: the server had room for what it refused.
func TestLowRateOverloadEnds(t *testing.T) {
	const workers, mean = 8, 50 * time.Millisecond
	capacity := float64(workers) / mean.Seconds()
	for seed := uint64(1); seed <= 24; seed++ {
		s := newSim(t, Config{}, workers, mean, seed)
		s.service = exponential(mean)
		s.open(0.5*capacity, 0, 2*time.Second, time.Second)
		s.open(4*capacity, 2*time.Second, 3*time.Second, time.Second)
		s.open(0.5*capacity, 3*time.Second, 6*time.Second, time.Second)
		s.run(7 * time.Second)
		if refused, _, _ := s.in(2*time.Second, 3*time.Second); refused == 0 {
			t.Errorf("seed %d: nothing refused at four times the capacity", seed)
		}
		if refused, served, _ := s.in(4*time.Second, 6*time.Second); refused != 0 {
			t.Errorf("seed %d: from 1 s after the overload, %d of %d refused at half the capacity", seed, refused, refused+served)
		}
	}
}

// A server that waits (any number of requests at once, each 100 ms on
// average, exponentially distributed: a gateway whose latency is its
// dependency's) meets open-loop traffic at 1 000/s from cold. Its first
// latency's worth looks like an overload: arrivals exceed completions
// while it fills, and the mean of its first answers, the fastest, is a
// fraction of its latency. Before, it then refused more than 90 % of its
// traffic for as long as the traffic lasted: the overload rule expected
// its latency (a mean) above that base plus the target however few it
// admitted. Now the requests the rule admits show that they take longer
// than it expected, and unrelated to what it expected (checkModel), the
// base follows, and the refusals end within 3 s. (The first 2 s are
// still mostly refused: see BENCHMARKS.md.)
//
// A server that waits 300 ms on average stops too. Its base from the
// first answers is a fraction of its latency, and checkModel's batches
// of 16 were too few samples of it: seed 4 was still refused 90 % in its
// tenth second (in 4 of 16 seeds, after 14 s); the long batch ends it.
func TestWaitingServerColdStartEnds(t *testing.T) {
	for _, c := range []struct {
		mean, deadline, from time.Duration // from: no refusal after it
	}{
		{100 * time.Millisecond, time.Second, 3 * time.Second},
		{300 * time.Millisecond, 2 * time.Second, 8 * time.Second},
	} {
		t.Run(c.mean.String(), func(t *testing.T) {
			for seed := uint64(1); seed <= 4; seed++ {
				s := newSim(t, Config{}, 1<<20, c.mean, seed)
				s.service = exponential(c.mean)
				s.open(1000, 0, 10*time.Second, c.deadline)
				s.run(10*time.Second + 3*c.mean + c.deadline)
				early, _, _ := s.in(0, c.from)
				refused, served, _ := s.in(c.from, 10*time.Second)
				t.Logf("seed %d: refused %d in the first %v, then %d of %d", seed, early, c.from, refused, refused+served)
				if refused != 0 {
					t.Errorf("seed %d: %d of %d refused after the first %v of a server that never queues", seed, refused, refused+served, c.from)
				}
			}
		})
	}
}

// A server that queues (8 workers, 5 ms on average, exponentially
// distributed) keeps its base through an open-loop overload at twice its
// capacity, after traffic at half of it, and with it a short queue. Its
// requests take somewhat longer than the overload rule expects (it
// admits most where the time per completion reads short); when
// checkModel looked at the means alone (1ac407c), the base rose check
// after check (seed 2: to 346 ms, p99 331 ms; in the review's runs to
// 1.5 s).
func TestQueueingServerKeepsItsBase(t *testing.T) {
	const workers, mean = 8, 5 * time.Millisecond
	capacity := float64(workers) / mean.Seconds() // 1 600/s
	for seed := uint64(1); seed <= 4; seed++ {
		s := newSim(t, Config{}, workers, mean, seed)
		s.service = exponential(mean)
		s.open(0.5*capacity, 0, 2*time.Second, 0)
		s.open(2*capacity, 2*time.Second, 8*time.Second, 0)
		keptBase(t, s, seed, 2*time.Second, 8*time.Second)
		_, served, p99 := s.in(2250*time.Millisecond, 8*time.Second)
		t.Logf("seed %d: served %.0f/s, p99 %v", seed, float64(served)/5.75, p99)
		if p99 > 100*time.Millisecond {
			t.Errorf("seed %d: p99 %v during the overload, want <= 100ms (a queue of at most the target, 20 ms, on 5 ms requests)", seed, p99)
		}
	}
}

// keptBase runs s to the overload's start and then to its end, and
// fails t if the base at the end is more than twice the base before it.
func keptBase(t *testing.T, s *sim, seed uint64, start, end time.Duration) {
	t.Helper()
	s.run(start)
	before := s.l.base
	s.run(end)
	after := s.l.base
	t.Logf("seed %d: base %v before, %v at the overload's end", seed, time.Duration(before), time.Duration(after))
	if after > 2*before {
		t.Errorf("seed %d: base %v at the overload's end, want at most twice the %v before it", seed, time.Duration(after), time.Duration(before))
	}
}

// A pause of the whole process (a GC, a CPU quota) during an overload
// stops every completion for 300 ms: the requests admitted meanwhile
// take the pause, which the overload rule could not expect, and are no
// sign of how the server serves. A server of 16 workers at 20 ms keeps
// its base through it (at 1ac407c, the requests admitted in the pause
// counted alone, and the base jumped to 586-657 ms, p99 to 592-669 ms;
// review of 1ac407c).
func TestPauseKeepsTheBase(t *testing.T) {
	const workers, service = 16, 20 * time.Millisecond
	capacity := float64(workers) / service.Seconds() // 800/s
	const pauseFrom, pauseTo = 3 * time.Second, 3300 * time.Millisecond
	for seed := uint64(1); seed <= 3; seed++ {
		s := newSim(t, Config{}, workers, service, seed)
		s.service = func(*rand.Rand) time.Duration {
			if s.el >= pauseFrom-service && s.el < pauseTo {
				return pauseTo - s.el + service // it ends after the pause
			}
			return service
		}
		s.closed(workers/2, 0, 2*time.Second)
		s.open(2*capacity, 2*time.Second, 5*time.Second, 0)
		keptBase(t, s, seed, 2*time.Second, 5*time.Second)
		_, _, p99 := s.in(3500*time.Millisecond, 5*time.Second)
		t.Logf("seed %d: p99 after the pause %v", seed, p99)
		// The rule admits everything while nothing completes, and what
		// it admitted in the pause is served after it: 200-250 ms of
		// p99 for a while, as before checkModel. More: the base rose.
		if p99 > 400*time.Millisecond {
			t.Errorf("seed %d: p99 %v after the pause, want <= 400ms", seed, p99)
		}
	}
}

// A dependency that hangs under load, then answers again: the requests
// admitted while it hung are still in flight until their callers'
// deadlines, and the overload rule counts them as a queue ahead of
// every new request, while the only completions are those hung requests
// ending. With few arrivals after it (a throttle above lets few through)
// the rule refused everything it got for 400 ms after the dependency was
// back (seed 5), and learned nothing, since it admitted nothing. A trial
// goes in once nothing has succeeded for a while; served at once, it
// ends the overload.
func TestTrialEndsAStaleOverload(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		s := newSim(t, Config{}, 1<<20, time.Millisecond, seed)
		s.fail = func() (bool, time.Duration) {
			return s.el >= 1500*time.Millisecond && s.el < 3*time.Second, time.Second
		}
		s.failAs = abandoned
		s.open(300, 0, 3*time.Second, time.Second)
		s.open(40, 3*time.Second, 5*time.Second, time.Second)
		s.run(6 * time.Second)
		for from := 2500 * time.Millisecond; from < 4*time.Second; from += 100 * time.Millisecond {
			refused, served, _ := s.in(from, from+100*time.Millisecond)
			t.Logf("seed %d, %v: refused %d admitted %d", seed, from, refused, served)
		}
		// From 100 ms after the dependency is back: what may pass before
		// a trial is due (4 mean latencies, at least maxWindows windows).
		if refused, served, _ := s.in(3100*time.Millisecond, 5*time.Second); refused != 0 {
			t.Errorf("seed %d: %d of %d refused from 100 ms after the dependency answered again", seed, refused, refused+served)
		}
	}
}

// pushOverloaded returns a function that ends a window of 20 ms (or
// dur) of an overloaded l, with the arrivals, refusals, successes and
// requests in flight given; l.mu is held by the caller.
func pushOverloaded(l *Limiter) func(dur, arrived, refused, done, inflight int64) {
	at := int64(0)
	return func(dur, arrived, refused, done, inflight int64) {
		at += dur
		w := window{dur: dur, arrived: arrived, refused: refused, done: done, latN: done, latSum: done * l.base, inflight: inflight, over: true}
		l.hist[l.histAt] = w
		l.histAt = (l.histAt + 1) % historyWindows
		l.histN = min(l.histN+1, historyWindows)
		l.whileOverloaded(w, at)
	}
}

// overloadedLimiter returns an overloaded Limiter whose base is 50 ms,
// with its lock held until the test ends.
func overloadedLimiter(t *testing.T) *Limiter {
	t.Helper()
	l, err := New(Config{Clock: newTimerClock()})
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	t.Cleanup(l.mu.Unlock)
	l.base = int64(50 * time.Millisecond)
	l.overloaded.Store(true)
	return l
}

// A window that lasted long with few events (a pause of the process, a
// clock that stepped forward) makes what is offered look slow for a few
// windows; it slows the overload's mean served rate as much, and does
// not end the overload (the most served over a few windows, the first
// form of the rule, did not slow with it).
func TestLongWindowKeepsOverload(t *testing.T) {
	l := overloadedLimiter(t)
	push := pushOverloaded(l)
	const ms = int64(time.Millisecond)
	for range 10 {
		push(20*ms, 3, 4, 3, 20) // 350/s offered, 150/s served, 20 in flight
	}
	push(time.Second.Nanoseconds(), 3, 4, 3, 20)
	for i := range 4 {
		push(20*ms, 3, 4, 3, 20)
		if !l.overloaded.Load() {
			t.Fatalf("the overload ended %d windows after a long one, with 20 in flight", i+1)
		}
	}
}

// A server that became slower during the overload (a fifth of the rate
// it served, still below what is offered) keeps its queue full: what is
// offered falls below the overload's mean served rate, but the requests
// in flight are more than that rate needs without a queue, and the
// overload goes on.
func TestSlowerServerKeepsOverload(t *testing.T) {
	l := overloadedLimiter(t)
	push := pushOverloaded(l)
	const ms = int64(time.Millisecond)
	for range 100 {
		push(20*ms, 3, 4, 3, 20) // 350/s offered, 150/s served, 20 in flight, for 2 s
	}
	for i := range 6 {
		push(100*ms, 1, 4, 2, 20) // 50/s offered, 20/s served, 20 in flight
		if !l.overloaded.Load() {
			t.Fatalf("the overload ended %d windows after the server slowed, with 20 in flight", i+1)
		}
	}
}

// Completions that come in bursts (a CPU-bound pool, a pause of the
// process) while arrivals go on at twice the rate served do not end the
// overload: the rate they are compared with is the overload's mean, not
// the most served over a few windows, which a burst raised past what
// was offered. (From the review of 2026-12-05, against the first form
// of the rule: it ended here.)
func TestBurstyCompletionsKeepOverload(t *testing.T) {
	l := overloadedLimiter(t)
	next := pushOverloaded(l)
	push := func(done int64) { next(int64(20*time.Millisecond), 3, 4, done, 8) }
	for range 10 {
		push(3) // 350/s offered, 150/s served
	}
	for i, d := range []int64{22, 0, 22, 0} {
		push(d)
		if !l.overloaded.Load() {
			t.Fatalf("the overload ended in the burst's window %d", i+1)
		}
	}
	for i := range 10 {
		push(3)
		if !l.overloaded.Load() {
			t.Fatalf("the overload ended %d windows after the burst", i+1)
		}
	}
}

// An open-loop overload whose callers set no deadline, or one longer
// than a second (patientBudget), pays for the answer probe that tells
// it from a load test's ramp (see TestLongRampBarelyRefused): once, at
// its start, the answers of what it serves wait until the probe finds
// the arrivals did not fall (up to 80 ms: answerHold, less once the
// second half has seen enough arrivals). The overload is declared as
// with short deadlines, and served at capacity with the target's
// latency after that slice. With deadlines of a second nothing is held
// (TestOpenLoopOverload). Not at 4x and more: the waiters fill the
// suspect queue, and the overload begins at once.
func TestPatientOpenLoopHeldOnce(t *testing.T) {
	const capacity = 8000.0 // 8 workers, 1 ms each
	for _, tc := range []struct {
		factor   float64
		deadline time.Duration
	}{{1.5, 0}, {2, 0}, {4, 0}, {1.5, 20 * time.Second}, {2, 2 * time.Second}} {
		factor := tc.factor
		t.Run(fmt.Sprintf("%vx, deadline %v", factor, tc.deadline), func(t *testing.T) {
			s := newSim(t, Config{}, 8, time.Millisecond, 3)
			s.open(0.5*capacity, 0, time.Second, tc.deadline)
			s.open(factor*capacity, time.Second, 3*time.Second, tc.deadline)
			s.open(0.5*capacity, 3*time.Second, 4*time.Second, tc.deadline)
			s.run(5 * time.Second)
			worst := time.Duration(0)
			for from := time.Second; from < 3*time.Second; from += 250 * time.Millisecond {
				refused, served, p99 := s.in(from, from+250*time.Millisecond)
				t.Logf("%v: refused %d served %d p99 %v", from, refused, served, p99)
				if p99 > 24*time.Millisecond {
					if worst > 0 {
						t.Errorf("%.1fx: p99 %v in a second slice of the overload (%v), want one slice at most above 24ms", factor, p99, from)
					}
					worst = p99
				}
			}
			if want := 24*time.Millisecond + answerHold; worst > want {
				t.Errorf("%.1fx: p99 %v in the probe's slice, want <= %v (24 ms and one hold)", factor, worst, want)
			}
			refused, served, _ := s.in(1250*time.Millisecond, 3*time.Second)
			if refused == 0 {
				t.Errorf("%.1fx: nothing refused in the overload", factor)
			}
			if rate := float64(served) / 1.75; rate < 0.9*capacity {
				t.Errorf("%.1fx: served %.0f/s during the overload, want >= 0.9 x %.0f", factor, rate, capacity)
			}
			if refused, _, _ := s.in(3100*time.Millisecond, 4*time.Second); refused != 0 {
				t.Errorf("%.1fx: %d refused from 100 ms after the overload", factor, refused)
			}
		})
	}
}
