package adaptive

import (
	"testing"
)

// BenchmarkAllowDone is the hot path of a healthy target: Allow, then
// Done(Accept), from parallel goroutines.
func BenchmarkAllowDone(b *testing.B) {
	th, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := th.Allow(false)
			if err == nil {
				p.Done(Accept)
			}
		}
	})
}

// BenchmarkAllowDown is a down target refusing requests.
func BenchmarkAllowDown(b *testing.B) {
	th, err := New(Config{ProbeRatio: 1e-9})
	if err != nil {
		b.Fatal(err)
	}
	for !th.Down() {
		p, err := th.Allow(false)
		if err == nil {
			p.Done(Overload)
		}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if p, err := th.Allow(false); err == nil {
				p.Done(Overload)
			}
		}
	})
}
