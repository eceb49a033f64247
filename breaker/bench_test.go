package breaker

import (
	"strconv"
	"testing"
)

// BenchmarkBreakerParallel measures the hot path: a closed breaker, Allow
// and Done(Success), from all Ps at once, on the system clock.
func BenchmarkBreakerParallel(b *testing.B) {
	br, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := br.Allow()
			if err != nil {
				b.Error(err)
				return
			}
			p.Done(Success)
		}
	})
}

// BenchmarkSetParallel measures Get for existing keys plus the hot path.
func BenchmarkSetParallel(b *testing.B) {
	const nkeys = 16
	s, err := NewSet(Config{}, 0)
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "target-" + strconv.Itoa(i) + ".example:443"
		s.Get(keys[i])
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			p, err := s.Get(keys[i%nkeys]).Allow()
			if err != nil {
				b.Error(err)
				return
			}
			p.Done(Success)
			i++
		}
	})
}

// BenchmarkBreakerOpen measures rejection by an open breaker.
func BenchmarkBreakerOpen(b *testing.B) {
	br, err := New(Config{OpenInterval: 1 << 40, MaxOpenInterval: 1 << 40})
	if err != nil {
		b.Fatal(err)
	}
	for range DefaultMinimumCalls {
		p, _ := br.Allow()
		p.Done(Failure)
	}
	if got := br.State(); got != Open {
		b.Fatalf("got state %v, want open", got)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := br.Allow(); err == nil {
				b.Error("Allow succeeded on an open breaker")
				return
			}
		}
	})
}
