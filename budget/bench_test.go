package budget

import (
	"fmt"
	"testing"
	"time"
)

// naiveBudget is the seed article's TypeScript RetryBudget, ported to Go
// line by line for comparison: two slices of timestamps (milliseconds, as
// Date.now() gives them), filtered into new slices on every record and
// canRetry call. The clock is injected so the benchmark can simulate a
// request rate; everything else is as in the article.
type naiveBudget struct {
	windowMs      float64
	maxRetryRatio float64

	timestamps      []float64
	retryTimestamps []float64

	now func() float64 // Date.now()
}

func newNaiveBudget(now func() float64) *naiveBudget {
	return &naiveBudget{windowMs: 10_000, maxRetryRatio: 0.2, now: now}
}

func (n *naiveBudget) record(isRetry bool) {
	now := n.now()
	n.timestamps = append(n.timestamps, now)
	if isRetry {
		n.retryTimestamps = append(n.retryTimestamps, now)
	}
	n.cleanup(now)
}

func (n *naiveBudget) canRetry() bool {
	now := n.now()
	n.cleanup(now)
	if len(n.timestamps) < 10 {
		return true // too little data
	}
	return float64(len(n.retryTimestamps))/float64(len(n.timestamps)) < n.maxRetryRatio
}

func (n *naiveBudget) cleanup(now float64) {
	cutoff := now - n.windowMs
	n.timestamps = filter(n.timestamps, func(t float64) bool { return t > cutoff })
	n.retryTimestamps = filter(n.retryTimestamps, func(t float64) bool { return t > cutoff })
}

// filter is Array.prototype.filter: it returns a new array.
func filter(ts []float64, keep func(float64) bool) []float64 {
	out := []float64{}
	for _, t := range ts {
		if keep(t) {
			out = append(out, t)
		}
	}
	return out
}

// simClock is a clock for single-goroutine benchmarks: no lock.
type simClock struct{ now time.Time }

func (c *simClock) Now() time.Time { return c.now }

var rates = []int{100, 1000, 10000}

// Both budgets see the same traffic: first attempts at rps per second of
// simulated time, the 10s window filled before the timer starts with one
// retry per 5 requests. Each op is one first attempt plus one retry
// decision (recording the retry if granted), 1/rps later than the last.

func BenchmarkNaiveSliceBudget(b *testing.B) {
	for _, rps := range rates {
		b.Run(fmt.Sprintf("rps=%d", rps), func(b *testing.B) {
			step := 1000 / float64(rps) // ms
			var now float64
			nb := newNaiveBudget(func() float64 { return now })
			for i := range 10 * rps {
				nb.timestamps = append(nb.timestamps, now)
				if i%5 == 0 {
					nb.timestamps = append(nb.timestamps, now)
					nb.retryTimestamps = append(nb.retryTimestamps, now)
				}
				now += step
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				now += step
				nb.record(false)
				if nb.canRetry() {
					nb.record(true)
				}
			}
		})
	}
}

func BenchmarkBudgetAtRate(b *testing.B) {
	for _, rps := range rates {
		b.Run(fmt.Sprintf("rps=%d", rps), func(b *testing.B) {
			step := time.Second / time.Duration(rps)
			clk := &simClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			bg, err := New(Config{Clock: clk})
			if err != nil {
				b.Fatal(err)
			}
			for i := range 10 * rps {
				bg.RecordRequest()
				if i%5 == 0 {
					bg.TryRetry()
				}
				clk.now = clk.now.Add(step)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				clk.now = clk.now.Add(step)
				bg.RecordRequest()
				bg.TryRetry()
			}
		})
	}
}

// BenchmarkBudgetParallel: every goroutine records a request per iteration
// and asks for a retry every tenth, on the system clock.
func BenchmarkBudgetParallel(b *testing.B) {
	bg, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			bg.RecordRequest()
			if i%10 == 0 {
				bg.TryRetry()
			}
			i++
		}
	})
}

// BenchmarkBudgetTryRetryParallel is the worst case: every iteration asks
// for a retry (and most are refused).
func BenchmarkBudgetTryRetryParallel(b *testing.B) {
	bg, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bg.TryRetry()
		}
	})
}

// BenchmarkThrottleParallel: every goroutine records an outcome per
// iteration (one in four a failure) and asks for a retry every tenth.
func BenchmarkThrottleParallel(b *testing.B) {
	th, err := NewThrottle(ThrottleConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			th.RecordOutcome(i%4 != 0)
			if i%10 == 0 {
				th.TryRetry()
			}
			i++
		}
	})
}
