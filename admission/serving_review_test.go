package admission

import (
	"math/rand/v2"
	"testing"
	"time"
)

// deathSeenAfter records failures at rate/s until the tracker says not
// serving, and returns how long that took.
func deathSeenAfter(s *Serving, clkAdvance func(time.Duration), every time.Duration) time.Duration {
	var d time.Duration
	for d < 10*time.Minute {
		clkAdvance(every)
		d += every
		if s.Record(false) {
			return d
		}
	}
	return d
}

// Second review, finding 1 (the mean run was a time, and one slow run
// hid an outage for 19 s): a quiet night: 19 failures at 1 request/s (a 19 s database outage, below
// MinFailures), then one served answer. The next day, at 1 000
// requests/s with nothing failing for hours, the database dies: the
// server must say NOT_SERVING within about a second.
func TestServingSlowRunDoesNotHideOutage(t *testing.T) {
	s, clk := newServing(t, ServingConfig{})
	for range 19 {
		clk.Advance(time.Second)
		s.Record(false)
	}
	clk.Advance(time.Second)
	s.Record(true)
	for range 1_000_000 { // hours of clean serving (fast path)
		s.Record(true)
	}
	clk.Advance(3 * time.Hour)
	d := deathSeenAfter(s, clk.Advance, time.Millisecond)
	if d > time.Second {
		t.Errorf("a real death at 1000 req/s seen after %v (want <= 1s)", d)
	}
}

// Ten minutes at 80 % random failures at 1 000 requests/s, never taken
// for dead; then a real death is seen within a second.
func TestServingDeathAfterLongPartialLoss(t *testing.T) {
	s, clk := newServing(t, ServingConfig{})
	r := rand.New(rand.NewPCG(1, 2))
	downs := 0
	for range 600_000 {
		clk.Advance(time.Millisecond)
		if s.Record(r.Float64() >= 0.8) && !s.Serving() {
			downs++
		}
	}
	d := deathSeenAfter(s, clk.Advance, time.Millisecond)
	if downs != 0 {
		t.Errorf("%d false downs at 80 %% random failures", downs)
	}
	if d > time.Second {
		t.Errorf("death seen after %v", d)
	}
}
