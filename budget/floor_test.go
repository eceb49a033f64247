package budget

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestHugeFloor: a floor so large that, counted in millionths over the
// window, it would not fit an int64 used to wrap to a negative number and
// refuse the very first retry. Such floors are now refused with the valid
// range, and the largest valid floor over the longest window grants.
func TestHugeFloor(t *testing.T) {
	for _, mrps := range []float64{1e12, 1e15, 1.0000001e9} {
		_, err := New(Config{MinRetriesPerSecond: mrps})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "out of range [0, 1e+09]") {
			t.Errorf("MinRetriesPerSecond %g: got error %v, want one wrapping ErrInvalidConfig with the range [0, 1e+09]", mrps, err)
		}
	}
	for _, w := range []time.Duration{MinWindow, DefaultWindow, MaxWindow} {
		b, _ := newBudget(t, Config{MinRetriesPerSecond: MaxMinRetriesPerSecond, Window: w})
		b.RecordRequest()
		for i := range 1000 {
			if !b.TryRetry() {
				t.Fatalf("Window %v, floor %g/s: retry %d refused, want every one granted", w, float64(MaxMinRetriesPerSecond), i)
			}
		}
	}
}
