package interceptor

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// happyStacks are the configurations the happy-path benchmarks compare, on
// a one-tier chain (the edge client and one healthy server) over bufconn.
func happyStacks(b *testing.B) map[string]testsvc.Config {
	set, err := breaker.NewSet(breaker.Config{}, 0)
	if err != nil {
		b.Fatal(err)
	}
	i, err := New(WithBudget(budget.Config{}), WithBreaker(set))
	if err != nil {
		b.Fatal(err)
	}
	one := []string{"payment"}
	return map[string]testsvc.Config{
		"none": {Tiers: one},
		"stormguard": {
			Tiers:         one,
			DialOptions:   func(int) []grpc.DialOption { return i.DialOptions() },
			ServerOptions: func(int) []grpc.ServerOption { return i.ServerOptions() },
		},
	}
}

// BenchmarkUnaryHappyPath measures what stormguard costs on a healthy
// call: client and server interceptors with budget and breaker on, against
// no interceptor.
func BenchmarkUnaryHappyPath(b *testing.B) {
	stacks := happyStacks(b)
	for _, name := range []string{"none", "stormguard"} {
		b.Run(name, func(b *testing.B) {
			c := testsvc.New(b, stacks[name])
			cl := c.Client()
			req := &testsvcv1.UnaryRequest{Id: "x"}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err := cl.Unary(ctx, req)
					cancel()
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkStreamHappyPath: one bidi stream per op, 100 messages each way,
// on a healthy server; stormguard keeps copies until the first response
// commits the stream.
func BenchmarkStreamHappyPath(b *testing.B) {
	stacks := happyStacks(b)
	for _, name := range []string{"none", "stormguard"} {
		b.Run(name, func(b *testing.B) {
			c := testsvc.New(b, stacks[name])
			cl := c.Client()
			req := &testsvcv1.BidiRequest{Id: "x", Payload: make([]byte, 64)}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := bidi100(cl, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

func bidi100(cl testsvcv1.TestServiceClient, req *testsvcv1.BidiRequest) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return testsvc.BidiRoundTrips(ctx, cl, req, 100)
}
