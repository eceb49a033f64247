package breaker

import (
	"math"
	"testing"
	"time"
)

// TestJitteredSaturates: jitter on an interval near the largest Duration
// saturates instead of wrapping to a negative interval.
func TestJitteredSaturates(t *testing.T) {
	huge := time.Duration(math.MaxInt64)
	for _, tc := range []struct {
		d    time.Duration
		u    float64
		want time.Duration
	}{
		{huge, 0.99, huge},
		{huge - time.Hour, 0.75, huge},
		{huge, 0.5, huge},
	} {
		if got := jittered(tc.d, 0.5, tc.u); got != tc.want {
			t.Errorf("jittered(%v, 0.5, %v): got %v, want %v", tc.d, tc.u, got, tc.want)
		}
	}
	if got := jittered(huge, 0.5, 0); got < huge/2-time.Second || got > huge/2+time.Second {
		t.Errorf("jittered(%v, 0.5, 0): got %v, want about half", huge, got)
	}
}

// TestHugeOpenIntervalWithJitter: a breaker at the longest open interval
// New accepts, jittered up, stays open for all of it (jittered itself
// saturates near the largest Duration: TestJitteredSaturates).
func TestHugeOpenIntervalWithJitter(t *testing.T) {
	b, clk := newTest(t, Config{OpenInterval: MaxInterval, Jitter: 0.5, Rand: func() float64 { return 0.99 }})
	trip(t, b)
	clk.Advance(MaxInterval * 14 / 10)
	if call(t, b, Success) {
		t.Fatalf("a call went through an open interval of %v jittered up by 49 %%", MaxInterval)
	}
}
