package admission

import (
	"fmt"
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

// Judged twice: where protection must fire, callers that leave at their
// deadline change nothing. An open loop at twice the capacity of two
// workers (300 µs on average, exponential) for 3 s after a second at
// half of it, 1 s deadlines: without a limiter the queue grows to the
// deadline (p99 of successes a second, 0.87-0.89x of capacity); with
// it, the excess is refused, what is served is served at once (p99 29
// ms, 1.01x), and everything is served in the half second after.
func TestOpenOverloadWithLeavingCallersRefused(t *testing.T) {
	const service = 300 * time.Microsecond
	capacity := 2 / service.Seconds()
	for _, seed := range []uint64{1, 2, 3} {
		s := newSim(t, Config{}, 2, service, seed)
		s.service = exponential(service)
		s.leave, s.late = true, true
		s.open(0.5*capacity, 0, time.Second, time.Second)
		s.open(2*capacity, time.Second, 4*time.Second, time.Second)
		s.open(0.5*capacity, 4*time.Second, 5*time.Second, time.Second)
		s.run(6 * time.Second)
		refused, _, _ := s.in(time.Second, 4*time.Second)
		ok, _ := s.inTime(time.Second, 4*time.Second)
		_, _, p99 := s.in(time.Second, 4*time.Second)
		after, afterAll := s.inTime(4500*time.Millisecond, 5*time.Second)
		goodput := float64(ok) / (3 * capacity)
		t.Logf("seed %d: %.2fx of capacity in time, p99 of what was served %v, %d refused, %d of %d served in the half second after", seed, goodput, p99, refused, after, afterAll)
		if goodput < 0.9 || p99 > 100*time.Millisecond || refused == 0 || after < afterAll*99/100 {
			t.Errorf("seed %d: %.2fx, p99 %v, %d refused, %d of %d after; want >= 0.9x, <= 100 ms, some refused, >= 99 %% after", seed, goodput, p99, refused, after, afterAll)
		}
	}
}

// Callers that left while the server was suspect do not wait any more:
// a closed loop whose callers leave at their deadline and send again
// (2 048 callers ramping over 200 ms on 64 workers of 1 ms, exponential,
// after a 5 ms wait; deadlines 38 ms, 1.2x the latency the loop makes)
// left thousands of their entries in the suspect phase's stack, below
// the newest, where only the phase's end drops them. Counted as waiting,
// they made the server look as if more waited than any closed loop
// could (6 595 entries of which about 1 270 waited), and overloaded: it
// refused 1.28 million requests and served 13 % of them in time, where
// the server alone served 99.9 % (a review's simulation). Now: 2 048
// callers wait at most, and no one is refused.
func TestLeftCallersDoNotWait(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		servedAsWithout(t, fmt.Sprintf("seed %d", seed), func(off bool) *sim {
			s := newSim(t, Config{}, 64, time.Millisecond, seed)
			s.service = exponential(time.Millisecond)
			s.wait = 5 * time.Millisecond
			s.leave, s.late, s.off = true, true, off
			s.closedRamp(2048, 0, 200*time.Millisecond, 3*time.Second, 38285*time.Microsecond)
			return s
		})
	}
}

// A closed loop that ramps slowly into a pool (512 callers started over
// 400 ms on 8 workers of 1 ms, 128 ms deadlines; the server alone serves
// them all in 64 ms) is suspect while it ramps. Its cap held the latency
// of what it let in just above the overload rule's threshold, so that no
// waiter went in before its deadline; the waiters left, their entries
// kept the server from looking calm, and it became overloaded: 1.1
// million refused, 2 % served in time (a review's simulation). The
// callers left because they waited in the limiter, not because the
// server could not serve them (all it held would have been served within
// their deadlines): their entries do not count against calm, and the
// loop is served as without a limiter.
func TestSlowRampIntoPoolServed(t *testing.T) {
	servedAsWithout(t, "slow ramp", func(off bool) *sim {
		s := newSim(t, Config{}, 8, time.Millisecond, 1)
		s.leave, s.late, s.off = true, true, off
		s.closedRamp(512, 0, 400*time.Millisecond, 3*time.Second, 128*time.Millisecond)
		return s
	})
}

// servedAsWithout runs the closed loop that build makes for 4 s, with a
// limiter and without (build(true)), and wants none of its first 3 s
// refused and as large a share served in time as without a limiter,
// less a point.
func servedAsWithout(t *testing.T, name string, build func(off bool) *sim) {
	t.Helper()
	inTime := func(off bool) (ok, all, refused int) {
		s := build(off)
		s.run(4 * time.Second)
		ok, all = s.inTime(0, 3*time.Second)
		refused, _, _ = s.in(0, 3*time.Second)
		return ok, all, refused
	}
	offOK, offAll, _ := inTime(true)
	ok, all, refused := inTime(false)
	offShare, share := float64(offOK)/float64(offAll), float64(ok)/float64(all)
	t.Logf("%s: %.1f %% in time (%d of %d; no limiter %.1f %%, %d of %d), %d refused", name, 100*share, ok, all, 100*offShare, offOK, offAll, refused)
	if refused > 0 || share < offShare-0.01 {
		t.Errorf("%s: %d refused, %.1f %% served in time; want none refused and at least the %.1f %% without a limiter, less a point", name, refused, 100*share, 100*offShare)
	}
}
