package admission

import (
	"fmt"
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
// waiters wait on for a window or so when the overload begins, and the
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
