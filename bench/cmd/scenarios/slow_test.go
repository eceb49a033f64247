package main

import (
	"testing"

	"github.com/stormguard/stormguard/bench"
)

func TestMedianSlow(t *testing.T) {
	runs := []bench.Slow{{Goodput: 0.875}, {Goodput: 0.5875}, {Goodput: 0.925}, {Goodput: 0.80}, {Goodput: 0.8625}}
	got := medianSlow(runs)
	if got.Goodput != 0.8625 {
		t.Errorf("median share %v, want 0.8625", got.Goodput)
	}
	if runs[0].Goodput != 0.5875 || runs[len(runs)-1].Goodput != 0.925 {
		t.Errorf("runs not sorted by share: %v ... %v", runs[0].Goodput, runs[len(runs)-1].Goodput)
	}
	// The whole run comes with its share: its other columns are its own.
	runs = []bench.Slow{{Goodput: 0.9}, {Goodput: 0.1}, {Goodput: 0.5, Opens: [3]int64{1, 2, 3}}}
	if got := medianSlow(runs); got.Opens != [3]int64{1, 2, 3} {
		t.Errorf("median run %+v, want the one with share 0.5 and its breaker openings", got)
	}
	if got := medianSlow([]bench.Slow{{Goodput: 0.7}}); got.Goodput != 0.7 {
		t.Errorf("one run: %v, want it", got.Goodput)
	}
}
