package bench

import (
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/testsvc"
)

// BenchmarkServerAdmission is the happy-path cost of admission control:
// one unary call per op on a one-tier chain with no client interceptor,
// and on the server no interceptor, stormguard's server interceptor, and
// stormguard's with WithAdmission. Compare with
//
//	benchstat -col /server out.txt
func BenchmarkServerAdmission(b *testing.B) {
	servers := []struct {
		name string
		opts []interceptor.Option
	}{
		{"none", nil},
		{"stormguard", []interceptor.Option{}},
		{"stormguard+admission", []interceptor.Option{interceptor.WithAdmission(admission.Config{})}},
	}
	for _, s := range servers {
		b.Run("server="+s.name, func(b *testing.B) {
			cfg := testsvc.Config{Tiers: oneTier}
			if s.opts != nil {
				i, err := interceptor.New(s.opts...)
				if err != nil {
					b.Fatal(err)
				}
				cfg.ServerOptions = func(int) []grpc.ServerOption { return i.ServerOptions() }
			}
			c := testsvc.New(b, cfg)
			if err := warm(c); err != nil {
				b.Fatal(err)
			}
			unaryParallel(b, c)
		})
	}
}

// BenchmarkLimiter is one admitted request through the limiter alone, from
// parallel goroutines: stormguard's admission.Limiter (Acquire, Release)
// and failsafe-go's adaptivelimiter (TryAcquirePermit, Record), both with
// limits high enough never to refuse. Compare with
//
//	benchstat -col /impl out.txt
func BenchmarkLimiter(b *testing.B) {
	b.Run("impl=stormguard", func(b *testing.B) {
		l, err := admission.New(admission.Config{MaxInFlight: 10000})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				p, err := l.Acquire(admission.ClassFirst, time.Time{})
				if err != nil {
					b.Error(err)
					return
				}
				p.Release(admission.Measured)
			}
		})
	})
	b.Run("impl=failsafe", func(b *testing.B) {
		l := adaptivelimiter.NewBuilder[any]().WithLimits(10000, 10000, 10000).Build()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				p, ok := l.TryAcquirePermit()
				if !ok {
					b.Error("failsafe-go refused a permit")
					return
				}
				p.Record()
			}
		})
	})
}
