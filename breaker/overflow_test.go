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

// TestHugeOpenIntervalWithJitter: a breaker whose open interval with
// jitter would overflow stays open (it used to be saved only by the
// overflow check in open, with a negative jittered interval in between).
func TestHugeOpenIntervalWithJitter(t *testing.T) {
	huge := time.Duration(math.MaxInt64)
	b, clk := newTest(t, Config{OpenInterval: huge, Jitter: 0.5, Rand: func() float64 { return 0.99 }})
	trip(t, b)
	clk.Advance(100 * 365 * 24 * time.Hour)
	if call(t, b, Success) {
		t.Fatalf("a call went through a century into an open interval of %v", huge)
	}
}
