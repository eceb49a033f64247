package admission

import (
	"context"
	"testing"
	"time"
)

// BenchmarkAcquireRelease is one admitted request: Acquire and Release
// with a latency sample, on the system clock, from parallel goroutines.
func BenchmarkAcquireRelease(b *testing.B) {
	l, err := New(Config{InitialLimit: 1000, MinLimit: 1000, MaxLimit: 1000})
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
	l, err := New(Config{InitialLimit: 1, MinLimit: 1, MaxLimit: 1})
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
	l, err := New(Config{InitialLimit: 1000, MinLimit: 1000, MaxLimit: 1000, QueueSize: 64})
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
