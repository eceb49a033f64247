package budget

import (
	"math"
	"runtime"
	"sync"
	"testing"
	"time"
)

// hammer runs workers goroutines, each doing ops iterations of
// RecordRequest plus, every other iteration, TryRetry, while tick (if not
// nil) runs alongside. It returns the number of retry asks.
func hammer(t *testing.T, b *Budget, workers, ops int, tick func()) (asks int64) {
	t.Helper()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range ops {
				b.RecordRequest()
				if i%2 == 0 {
					b.TryRetry()
				}
			}
		})
	}
	if tick != nil {
		wg.Go(tick)
	}
	wg.Wait()
	return int64(workers * ((ops + 1) / 2))
}

func TestStressBudget(t *testing.T) {
	const workers, ops = 8, 5000
	ratio := 0.2

	t.Run("still clock", func(t *testing.T) {
		// One bucket, no rotation: the CAS makes the budget exact.
		b, _ := newBudget(t, Config{Ratio: ratio, NoFloor: true})
		asks := hammer(t, b, workers, ops, nil)
		s := b.Snapshot()
		if s.Requests != workers*ops {
			t.Errorf("requests: got %d, want %d (lost updates)", s.Requests, workers*ops)
		}
		if s.Granted+s.Refused != asks || s.Retries != s.Granted {
			t.Errorf("got %+v, want granted+refused = %d asks and retries = granted", s, asks)
		}
		if limit := int64(math.Ceil(ratio * workers * ops)); s.Granted > limit {
			t.Errorf("granted: got %d, want <= %d", s.Granted, limit)
		}
	})

	t.Run("clock crossing buckets within one window", func(t *testing.T) {
		// Buckets change under the workers but none expires yet, so every
		// count must survive.
		b, clk := newBudget(t, Config{Ratio: ratio, NoFloor: true})
		asks := hammer(t, b, workers, ops, func() {
			for range 90 { // 9s in 100ms steps: buckets 0 to 9
				clk.Advance(100 * time.Millisecond)
				runtime.Gosched()
			}
		})
		s := b.Snapshot()
		if s.Requests != workers*ops {
			t.Errorf("requests: got %d, want %d (lost updates)", s.Requests, workers*ops)
		}
		if s.Granted+s.Refused != asks || s.Retries != s.Granted {
			t.Errorf("got %+v, want granted+refused = %d asks and retries = granted", s, asks)
		}
		// Documented slack: one retry per concurrent caller at a rotation.
		if limit := int64(math.Ceil(ratio*workers*ops)) + workers; s.Granted > limit {
			t.Errorf("granted: got %d, want <= %d", s.Granted, limit)
		}
	})

	t.Run("clock turning the ring many times", func(t *testing.T) {
		b, clk := newBudget(t, Config{Ratio: ratio})
		asks := hammer(t, b, workers, ops, func() {
			for range 1000 { // 250s in 250ms steps
				clk.Advance(250 * time.Millisecond)
				runtime.Gosched()
			}
		})
		s := b.Snapshot()
		if s.Granted+s.Refused != asks {
			t.Errorf("granted %d + refused %d: want %d asks", s.Granted, s.Refused, asks)
		}
		if limit := int64(math.Ceil(ratio*float64(s.Requests)+100)) + workers; s.Retries > limit {
			t.Errorf("retries in the window: got %d, want <= %d", s.Retries, limit)
		}
		// The state is sound afterwards: a fresh window behaves exactly.
		clk.Advance(time.Hour)
		if s := b.Snapshot(); s.Requests != 0 || s.Retries != 0 {
			t.Fatalf("after an hour: got %+v, want an empty window", s)
		}
		record(b, 50)
		if got, want := grantAll(t, b), 110; got != want {
			t.Errorf("granted after the storm: got %d, want %d", got, want)
		}
	})
}

func TestStressThrottle(t *testing.T) {
	const workers, ops = 8, 2000
	th, err := NewThrottle(ThrottleConfig{MaxTokens: 1000, TokenRatio: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	// Failures only: the count falls monotonically, so the order does not
	// matter: 1000 - 16000 clamps to 0.
	run := func(f func()) {
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range ops {
					f()
				}
			})
		}
		wg.Wait()
	}
	run(func() { th.RecordOutcome(false); th.TryRetry() })
	s := th.Snapshot()
	if s.Tokens != 0 {
		t.Errorf("after %d failures: got %v tokens, want 0", workers*ops, s.Tokens)
	}
	// A grant needs more than 500 tokens, so fewer than 500 failures
	// before it, and each failure precedes at most one ask.
	if s.Granted+s.Refused != workers*ops || s.Granted > 499 {
		t.Errorf("got %+v, want granted+refused = %d and granted <= 499", s, workers*ops)
	}
	// Successes only: 16000 x 0.5 = 8000 clamps to 1000.
	run(func() { th.RecordOutcome(true) })
	if got := th.Snapshot().Tokens; got != 1000 {
		t.Errorf("after %d successes: got %v tokens, want 1000", workers*ops, got)
	}
	// Mixed outcomes that can never reach a bound, in any order: from 500
	// tokens, 8 x 60 failures take at most 480 and 2 x 8 x 60 successes
	// add at most 480, so no clamp applies and every interleaving must end
	// at exactly 500. A lost update (a read-modify-write without the
	// compare-and-swap) shows as another count.
	for range 500 {
		th.RecordOutcome(false)
	}
	if got := th.Snapshot().Tokens; got != 500 {
		t.Fatalf("after 500 failures from full: got %v tokens, want 500", got)
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range 60 {
				th.RecordOutcome(false)
				th.RecordOutcome(true)
				th.RecordOutcome(true)
			}
		})
	}
	wg.Wait()
	if got := th.Snapshot().Tokens; got != 500 {
		t.Errorf("after balanced mixed outcomes: got %v tokens, want exactly 500", got)
	}
}
