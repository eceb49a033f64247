package admission

import (
	"context"
	"testing"
	"time"
)

// BenchmarkAcquireRelease is one admitted request: Acquire and Release
// with a latency sample, on the system clock, from parallel goroutines.
func BenchmarkAcquireRelease(b *testing.B) {
	l, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := l.Acquire(ClassFirst, time.Time{})
			if err != nil {
				b.Error(err)
				return
			}
			p.Release(Measured)
		}
	})
}

// BenchmarkReject is one request refused at the limit.
func BenchmarkReject(b *testing.B) {
	l, err := New(Config{MaxInFlight: 1})
	if err != nil {
		b.Fatal(err)
	}
	p, _ := l.Acquire(ClassFirst, time.Time{})
	defer p.Release(Ignored)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Acquire(ClassRetry, time.Time{}); err == nil {
				b.Error("admitted over the limit")
				return
			}
		}
	})
}

// BenchmarkWaitRelease is BenchmarkAcquireRelease through Wait with a
// queue configured but not needed: it must allocate nothing either.
func BenchmarkWaitRelease(b *testing.B) {
	l, err := New(Config{MaxInFlight: 1000, QueueSize: 64})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := l.Wait(ctx, ClassFirst, time.Time{})
			if err != nil {
				b.Error(err)
				return
			}
			p.Release(Measured)
		}
	})
}

// BenchmarkServingServed is the health tracker on a healthy server: every
// answer served (Epoch when the request starts, RecordFrom when it ends),
// from parallel goroutines: two atomic loads, no lock, no clock.
func BenchmarkServingServed(b *testing.B) {
	s, err := NewServing(ServingConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.RecordFrom(s.Epoch(), true)
		}
	})
}

// BenchmarkServingRandomFailures: one answer in ten fails at random, so
// a tenth of the answers and the served one after each take the lock and
// read the clock.
func BenchmarkServingRandomFailures(b *testing.B) {
	s, err := NewServing(ServingConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			s.RecordFrom(s.Epoch(), i%10 != 0)
		}
	})
	if s.Downs() != 0 {
		b.Fatalf("Downs = %d at 10 %% failures", s.Downs())
	}
}
