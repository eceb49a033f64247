package bench

import (
	"testing"

	"github.com/failsafe-go/failsafe-go/adaptivethrottler"

	"github.com/stormguard/stormguard/adaptive"
)

// BenchmarkAdaptiveThrottle compares the hot path of a healthy target, one
// permit and its success, of stormguard's adaptive throttle with the
// nearest peer primitive, failsafe-go's adaptivethrottler, in one run.
func BenchmarkAdaptiveThrottle(b *testing.B) {
	b.Run("stormguard", func(b *testing.B) {
		t, err := adaptive.New(adaptive.Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if p, err := t.Allow(false); err == nil {
					p.Done(adaptive.Accept)
				}
			}
		})
	})
	b.Run("failsafe-go", func(b *testing.B) {
		t := adaptivethrottler.NewWithDefaults[any]()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if t.TryAcquirePermit() {
					t.RecordSuccess()
				}
			}
		})
	})
}
