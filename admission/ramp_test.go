package admission

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// A load test that ramps its callers up for longer than the suspect
// phase lasts (ghz --concurrency-schedule step, k6's ramping users)
// keeps arrivals above completions all that while, as an open-loop
// overload would, and the server became overloaded in the middle of it.
// It refused the waiting callers, and every refused caller sent again at
// once until the next probe, 50 windows later: a warm pool of 4 workers
// of 5 ms meeting 128 callers started over 400 ms refused 552 231
// requests, and over TCP (busy's chain, ghz ramping 512 callers over
// 1.6 s into such a pool) 81-89 % of all requests were refused. Now the
// waiters wait on for up to 8 windows when the overload begins, and the
// callers refused meanwhile, sending again at once, show a closed loop:
// the server is suspect again, its waiters served oldest first from
// then on, and each caller meets a refusal about once per overload that
// begins (before: thousands of times).
func TestLongRampBarelyRefused(t *testing.T) {
	for _, tc := range []struct {
		workers  int
		service  time.Duration
		callers  int
		ramp     time.Duration
		deadline time.Duration
	}{
		{4, 5 * time.Millisecond, 128, 400 * time.Millisecond, 0},
		{4, 5 * time.Millisecond, 512, 1600 * time.Millisecond, 0},
		{4, 5 * time.Millisecond, 512, 1600 * time.Millisecond, 2 * time.Second},
		{4, 5 * time.Millisecond, 512, 1600 * time.Millisecond, 20 * time.Second},
		{4, 5 * time.Millisecond, 512, 1600 * time.Millisecond, time.Second},
		{8, time.Millisecond, 1024, 800 * time.Millisecond, 20 * time.Second},
		{8, time.Millisecond, 1024, 800 * time.Millisecond, 0},
		{64, 20 * time.Millisecond, 1024, 1600 * time.Millisecond, 0},
	} {
		name := fmt.Sprintf("%dx%v, %d callers over %v, deadline %v", tc.workers, tc.service, tc.callers, tc.ramp, tc.deadline)
		t.Run(name, func(t *testing.T) {
			run := func(off bool) (refused, served int, p99 time.Duration) {
				s := newSim(t, Config{}, tc.workers, tc.service, 1)
				s.late, s.off = true, off
				s.leave = tc.deadline > 0
				s.closedRamp(tc.workers/2+1, 0, 0, 5*time.Second, tc.deadline) // the warm-up
				s.run(500 * time.Millisecond)
				s.closedRamp(tc.callers, 500*time.Millisecond, tc.ramp, 5*time.Second, tc.deadline)
				s.run(5 * time.Second)
				return s.in(0, 5*time.Second)
			}
			_, offServed, offP99 := run(true)
			refused, served, p99 := run(false)
			t.Logf("refused %d (%.2f a caller), served %d (no limiter %d), p99 %v (%v)", refused, float64(refused)/float64(tc.callers), served, offServed, p99, offP99)
			if refused > 4*tc.callers {
				t.Errorf("%d refused, %.1f a caller: want at most 4 a caller", refused, float64(refused)/float64(tc.callers))
			}
			// Callers that set no deadline (ghz --timeout 0, many Go
			// callers), or one longer than a second (ghz's default of 20
			// s), are refused nothing: with no short deadline among the
			// waiting callers, a suspect phase that runs out holds its
			// answers before any verdict (startAnswerProbe), and the
			// ramp's arrivals fall with them. Before, the first verdict
			// refused the callers' spin until it read the closed loop:
			// here 67-556 refused, over TCP (busy's ramp, 512 and 1 024
			// callers into a pool of 4 x 5 ms) 93-97 a run, every one in
			// the first half second. With deadlines of a second it
			// still does (67 here).
			if (tc.deadline == 0 || tc.deadline > patientBudget) && refused != 0 {
				t.Errorf("%d refused with deadline %v, want none", refused, tc.deadline)
			}
			// The waiters a closed loop's verdict keeps go oldest first:
			// newest first, the oldest waited out the ramp (p99 2.2-4.4
			// times the p99 without a limiter).
			if p99 > 2*offP99 {
				t.Errorf("p99 %v, want at most twice the %v without a limiter", p99, offP99)
			}
			if float64(served) < 0.98*float64(offServed) {
				t.Errorf("served %d, want at least 98 %% of the %d served without a limiter", served, offServed)
			}
		})
	}
}

// A ramp whose callers' deadlines are shorter than their queue (512
// callers of a pool of 4 x 5 ms, 640 ms at capacity, with 300 ms
// deadlines) cannot be served in time by a server that lets them all
// wait. The overloads that refuse the ramp's spin keep what the server
// holds nearer the deadlines until a verdict reads the closed loop:
// 2 728 served in time, 1 126 without a limiter. (The verdict before
// spinEarly and spinSeed served 4 059, by accident: its overloads went
// on refusing the spin after the ramp, 150 000 refusals a run; over
// the review grid's ramps with 300 ms deadlines, the faster verdict
// serves 0.8 % more in time with 93 % fewer refusals. Suspect phases
// made longer after each closed verdict, tried and reverted, served
// 2 448.) Once the ramp is over, such a closed loop is served late with
// or without a limiter (all 512 callers at once: 533 in time, either
// way): a server that is calm is never refused anything.
func TestShortDeadlineRampServedInTime(t *testing.T) {
	run := func(off bool) (ok, all int) {
		s := newSim(t, Config{}, 4, 5*time.Millisecond, 1)
		s.late, s.leave, s.off = true, true, off
		const deadline = 300 * time.Millisecond
		s.closedRamp(3, 0, 0, 5*time.Second, deadline) // the warm-up
		s.run(500 * time.Millisecond)
		s.closedRamp(512, 500*time.Millisecond, 1600*time.Millisecond, 5*time.Second, deadline)
		s.run(6 * time.Second)
		return s.inTime(0, 5*time.Second)
	}
	offOK, _ := run(true)
	ok, all := run(false)
	t.Logf("%d of %d served in time (no limiter %d)", ok, all, offOK)
	if ok < 2*offOK {
		t.Errorf("%d served in time, want at least twice the %d without a limiter", ok, offOK)
	}
}

// openRetrying sends Poisson arrivals at rate per second from start to
// end, each with deadline (0: none), whose callers retry a refused
// request after a pause of up to backoff, up to attempts in all (a retry
// policy with a short backoff).
func (s *sim) openRetrying(rate float64, start, end, deadline time.Duration, attempts int, backoff time.Duration) {
	tries := map[int]int{}
	id := 1 << 20
	s.onAnswer = func(c int) {
		if r := s.results[len(s.results)-1]; r.refused && tries[c] < attempts-1 {
			tries[c]++
			pause := time.Duration(s.rnd.Float64() * float64(backoff))
			s.at(s.el+pause+100*time.Microsecond, func() { s.arrive(c, ClassRetry, deadline) })
			return
		}
		delete(tries, c)
	}
	var next func()
	next = func() {
		if s.el >= end {
			return
		}
		id++
		s.arrive(id, ClassFirst, deadline)
		s.at(s.el+max(time.Duration(s.rnd.ExpFloat64()/rate*float64(time.Second)), 1), next)
	}
	s.at(start, next)
}

// An open loop whose callers retry a refusal at once, up to 5 times,
// offers up to 5 times its rate while it is refused, and read as a
// closed loop's spin (once by a verdict at 3 times the rate of before
// that counted the retries), its waiters waited on and went in: the
// overload left thousands in flight, and none of the half load after it
// was served within 2 s (a review's simulation: a pool of 4 x 5 ms at
// 4x, retries within 10 ms, 1 s deadlines; 806-847 served with the
// verdict's parent). The verdict counts first attempts only: the
// retries it refuses do not read as a spin however soon they come.
func TestRetryingOpenLoopKeepsItsOverload(t *testing.T) {
	const capacity = 800.0
	for seed := uint64(1); seed <= 2; seed++ {
		s := newSim(t, Config{}, 4, 5*time.Millisecond, seed)
		s.late = true
		s.openRetrying(0.5*capacity, 0, time.Second, time.Second, 5, 10*time.Millisecond)
		s.run(time.Second)
		s.openRetrying(4*capacity, time.Second, 3*time.Second, time.Second, 5, 10*time.Millisecond)
		s.run(3 * time.Second)
		s.openRetrying(0.5*capacity, 3*time.Second, 5*time.Second, time.Second, 5, 10*time.Millisecond)
		s.run(6 * time.Second)
		refused, served, _ := s.in(time.Second, 3*time.Second)
		_, after, p99 := s.in(3500*time.Millisecond, 5*time.Second)
		t.Logf("seed %d: overload %d refused, %d served; after %d served, p99 %v; %d in flight at 6 s", seed, refused, served, after, p99, s.l.InFlight())
		if after < 500 || p99 > 100*time.Millisecond {
			t.Errorf("seed %d: %d served from 500 ms after the overload (400/s for 1.5 s), p99 %v; want >= 500, <= 100 ms", seed, after, p99)
		}
	}
}

// Waiters held for the verdict wait on a timer, not on the next window:
// an open-loop burst that stops the moment the overload begins left them
// waiting until the next arrival, seconds later, or for good (a
// review's simulation: 211-741 still waiting at 5 s, nothing in
// flight). And an overload that ends before its verdict refuses them,
// as an overload's start did before there was a verdict: let in, they
// were a backlog ahead of the load after it.
func TestVerdictWaitersNotStuck(t *testing.T) {
	for _, factor := range []float64{2, 4} {
		s := newSim(t, Config{}, 4, 5*time.Millisecond, 1)
		s.open(400, 0, time.Second, 0)
		var next func()
		next = func() {
			if s.l.Overloaded() {
				return // the burst stops with the overload's start
			}
			s.arrive(noCaller, ClassFirst, 0)
			s.at(s.el+max(time.Duration(s.rnd.ExpFloat64()/(factor*800)*float64(time.Second)), 1), next)
		}
		s.at(time.Second, next)
		s.run(3 * time.Second)
		if n := len(s.parked); n != 0 {
			t.Errorf("%.0fx: %d requests still waiting in the limiter 2 s after the burst stopped", factor, n)
		}
	}
}

// A ramp into a chain that answers refusals slowly (its CPU saturated):
// the callers refused when an overload begins come back a few
// milliseconds later, and their spin reads a few times the rate of
// before, not tens, until many of them spin. Read against spinRatio
// alone, the verdict took the ramp for an open loop: it refused the
// waiters, and every caller until the next probe (512 callers of a pool
// of 4 x 5 ms over 1.6 s, refusals answered in 1, 5, 10, 20 ms: 3 372,
// 53 437, 27 093 and 14 927 refused). Now the bar falls as the
// windows pass, and after the first window some waiters are refused at
// once (spinSeed), so that a closed loop's spin shows: 975, 1 042,
// 779 and 997.
func TestSlowSpinRampBarelyRefused(t *testing.T) {
	for _, rtt := range []time.Duration{time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond} {
		s := newSim(t, Config{}, 4, 5*time.Millisecond, 1)
		s.late = true
		s.refusedRTT = rtt
		s.closedRamp(3, 0, 0, 5*time.Second, 0) // the warm-up
		s.run(500 * time.Millisecond)
		s.closedRamp(512, 500*time.Millisecond, 1600*time.Millisecond, 5*time.Second, 0)
		s.run(5 * time.Second)
		refused, served, p99 := s.in(0, 5*time.Second)
		t.Logf("refusals answered in %v: refused %d (%.2f a caller), served %d, p99 %v", rtt, refused, float64(refused)/512, served, p99)
		if refused > 4*512 {
			t.Errorf("refusals answered in %v: %d refused, %.1f a caller: want at most 4 a caller", rtt, refused, float64(refused)/512)
		}
		if served < 3800 { // 800/s for 4.5 s after the warm-up's 0.5 s
			t.Errorf("refusals answered in %v: %d served, want at least 3 800", rtt, served)
		}
	}
}

// A ramp that outlasts several suspect phases (ghz adding 8 callers
// every 25 ms up to 512 or 1 024) meets one verdict, not one a phase:
// each phase it outlasted became an overload whose verdict refused the
// spin of its callers before it read the closed loop again (a pool of 4
// x 5 ms, 512 callers over 1.6 s: five overloads, 335 refusals; over
// TCP 379-384 refusals, at 1 024 callers 748-767). Once a verdict has
// found a closed loop, a phase that runs out holds its answers instead
// (startAnswerProbe): the ramp's arrivals fall to its new callers, and
// the server is suspect again, refusing no one.
func TestRampJudgedOnce(t *testing.T) {
	for _, tc := range []struct {
		workers int
		service time.Duration
		callers int
		ramp    time.Duration
	}{
		{4, 5 * time.Millisecond, 512, 1600 * time.Millisecond},
		{4, 5 * time.Millisecond, 1024, 3100 * time.Millisecond},
		{64, 20 * time.Millisecond, 1024, 1600 * time.Millisecond},
	} {
		name := fmt.Sprintf("%dx%v, %d callers over %v", tc.workers, tc.service, tc.callers, tc.ramp)
		s := newSim(t, Config{}, tc.workers, tc.service, 1)
		s.late = true
		s.closedRamp(tc.workers/2+1, 0, 0, 6*time.Second, 0) // the warm-up
		s.run(500 * time.Millisecond)
		s.closedRamp(tc.callers, 500*time.Millisecond, tc.ramp, 6*time.Second, 0)
		s.run(6 * time.Second)
		// Each overload's refusals come within milliseconds of its
		// start (the callers' spin until the verdict): count the bursts.
		var at []time.Duration
		for _, r := range s.results {
			if r.refused {
				at = append(at, r.at)
			}
		}
		slices.Sort(at)
		bursts := 0
		for i := range at {
			if i == 0 || at[i]-at[i-1] > 100*time.Millisecond {
				bursts++
			}
		}
		refused, served, p99 := s.in(0, 6*time.Second)
		t.Logf("%s: %d bursts of refusals, %d refused, %d served, p99 %v", name, bursts, refused, served, p99)
		if bursts > 1 {
			t.Errorf("%s: %d bursts of refusals (overloads), want at most 1", name, bursts)
		}
	}
}

// HoldAnswer returns at once, except while an answer probe holds the
// answers: then when the probe ends, or when its context is done.
func TestHoldAnswerHoldsDuringAnAnswerProbe(t *testing.T) {
	s := newSim(t, Config{}, 4, 5*time.Millisecond, 1)
	s.late = true
	s.closedRamp(3, 0, 0, 6*time.Second, 0) // the warm-up
	s.run(500 * time.Millisecond)
	s.l.HoldAnswer(context.Background()) // no probe: at once
	s.closedRamp(512, 500*time.Millisecond, 1600*time.Millisecond, 6*time.Second, 0)
	d := 500 * time.Millisecond
	for ; d < 3*time.Second && !s.l.answerProbe.on; d += time.Millisecond {
		s.run(d)
	}
	if !s.l.answerProbe.on {
		t.Fatal("no answer probe within the ramp: the test shows nothing")
	}
	// The fake clock stands still: a hold ends only with its caller's
	// context (here a real 20 ms), or with the probe.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	left := make(chan struct{})
	go func() {
		defer close(left)
		s.l.HoldAnswer(ctx)
	}()
	select {
	case <-left:
	case <-time.After(10 * time.Second):
		t.Fatal("HoldAnswer still waits after its context ended")
	}
	if ctx.Err() == nil {
		t.Fatal("HoldAnswer returned during the probe, before its context ended")
	}
	held := make(chan struct{})
	go func() {
		defer close(held)
		s.l.HoldAnswer(context.Background())
	}()
	s.run(d + answerHold)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("HoldAnswer still waits after the probe's end")
	}
	if s.l.answerProbe.on {
		t.Fatal("the probe still runs after its hold")
	}
}

// A ramp of 2 048 callers over 1.6 s with 100 ms deadlines into a pool
// of 16 workers of 10 ms (exponential): the suspect phases' caps grow
// as the ramp's callers come, and a phase whose cap still grows does
// not run out (stillGrowing), but only while its oldest waiter can
// still be served in time. Without that condition the phases held the
// ramp's waiters until their callers left: 13 821 served in time over
// these 4 runs, against 16 480 with it (and before phases went on while
// growing).
func TestStillGrowingNotForLateWaiters(t *testing.T) {
	const leastServed = 15000
	served := 0
	for seed := uint64(1); seed <= 4; seed++ {
		s := newSim(t, Config{}, 16, 10*time.Millisecond, seed)
		s.service = exponential(10 * time.Millisecond)
		s.late, s.leave = true, true
		s.closedRamp(9, 0, 0, 3*time.Second, 100*time.Millisecond) // the warm-up
		s.run(500 * time.Millisecond)
		s.closedRamp(2048, 500*time.Millisecond, 1600*time.Millisecond, 3*time.Second, 100*time.Millisecond)
		s.run(3500 * time.Millisecond)
		ok, all := s.inTime(0, 3*time.Second)
		t.Logf("seed %d: %d of %d served in time", seed, ok, all)
		served += ok
	}
	if served < leastServed {
		t.Errorf("%d served in time over the 4 runs, want at least %d (the phases held the waiters past their deadlines)", served, leastServed)
	}
}
