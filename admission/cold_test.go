package admission

import (
	"fmt"
	"testing"
	"time"
)

// A server that waits on its dependency, with latencies that spread
// (exponentially), meets open-loop traffic that never overloads it from
// its first request, a second after it started. Its first answers are
// its fastest; before the total time on test (coldStart), their mean
// made it suspect at once, and it refused 10-25 % of the first 10 s
// waiting 100 ms, 19-60 % waiting 300 ms, and 26-88 % waiting a second
// (83-88 % and for good in 7 of 8 seeds).
func TestColdStartOfAWaitingServer(t *testing.T) {
	for _, c := range []struct {
		mean time.Duration
		rate float64 // a second
	}{
		{100 * time.Millisecond, 1000},
		{300 * time.Millisecond, 1000},
		{time.Second, 300},
	} {
		t.Run(c.mean.String(), func(t *testing.T) {
			for seed := uint64(1); seed <= 4; seed++ {
				s := newSim(t, Config{}, 1<<20, c.mean, seed)
				s.service = exponential(c.mean)
				s.open(c.rate, time.Second, 11*time.Second, time.Second+3*c.mean)
				s.run(12*time.Second + 4*c.mean)
				if refused, served, _ := s.in(time.Second, 11*time.Second); refused != 0 {
					t.Errorf("seed %d: %d of %d refused from the cold start of a server that never queues", seed, refused, refused+served)
				}
			}
		})
	}
}

// A pool overloaded from its first request holds its queue in flight,
// and the total time on test would take that queue for its latency:
// taken as the base from the start, 64 workers of 5 ms (exponential) at
// eight times their capacity got a base of 68-80 ms and a p99 of
// 91-97 ms. Their completions come at a steady rate, so the cold start
// leaves the base to the first answers.
func TestColdStartOfAPool(t *testing.T) {
	const workers, mean = 64, 5 * time.Millisecond
	capacity := workers / mean.Seconds()
	for _, factor := range []float64{2, 8} {
		t.Run(fmt.Sprint(factor), func(t *testing.T) {
			for seed := uint64(1); seed <= 2; seed++ {
				s := newSim(t, Config{}, workers, mean, seed)
				s.service = exponential(mean)
				s.late = true
				s.open(factor*capacity, 0, 1500*time.Millisecond, time.Second)
				s.run(2500 * time.Millisecond)
				_, served, p99 := s.in(500*time.Millisecond, 1500*time.Millisecond)
				t.Logf("seed %d: base %v, served %.0f/s, p99 %v", seed, time.Duration(s.l.base), float64(served), p99)
				if p99 > 60*time.Millisecond {
					t.Errorf("seed %d: p99 %v after the first 500 ms, want <= 60ms (5 ms service + 20 ms target + its noise)", seed, p99)
				}
			}
		})
	}
}

// A pool of few slow workers (2 of 8 ms) overloaded at eight times its
// capacity from its first request completes too few requests to tell
// acceleration for a while, and waiting for that verdict let a queue
// build: p99 0.7-0.9 s. Its first answers show the queue (each took
// most of the time since the first request), and the wait ends there.
func TestColdStartOfASlowPool(t *testing.T) {
	const workers, mean = 2, 8 * time.Millisecond
	capacity := workers / mean.Seconds()
	for seed := uint64(1); seed <= 3; seed++ {
		s := newSim(t, Config{}, workers, mean, seed)
		s.service = exponential(mean)
		s.late = true
		s.open(8*capacity, 0, 5*time.Second, time.Second)
		s.run(6 * time.Second)
		_, served, p99 := s.in(500*time.Millisecond, 5*time.Second)
		t.Logf("seed %d: base %v, served %.0f/s, p99 %v", seed, time.Duration(s.l.base), float64(served)/4.5, p99)
		if p99 > 150*time.Millisecond {
			t.Errorf("seed %d: p99 %v after the first 500 ms, want <= 150ms", seed, p99)
		}
	}
}

// A hang below a warm server (its dependency answers nothing from 2 s to
// 3.5 s, and its requests end at their callers' deadlines, Abandoned)
// completes about as many requests as arrive, but not in every window:
// when windows that completed only Abandoned requests could make it
// suspect at any time (fb237ff), it refused 95 % of its traffic until
// 0.6 s after the hang, in 3 of 8 seeds. Only a cold start reads such a
// window as a queue.
func TestHangAfterTheColdStartRefusesNothingAfter(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		s := newSim(t, Config{}, 1<<20, 30*time.Millisecond, seed)
		s.fail = func() (bool, time.Duration) {
			return s.el >= 2*time.Second && s.el < 3500*time.Millisecond, time.Second
		}
		s.failAs = abandoned
		s.open(300, 0, 7*time.Second, time.Second)
		s.run(9 * time.Second)
		if refused, served, _ := s.in(3500*time.Millisecond, 7*time.Second); refused != 0 {
			t.Errorf("seed %d: %d of %d refused after the hang", seed, refused, refused+served)
		}
	}
}
