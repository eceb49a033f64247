package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// The happy-path benchmarks run each stack on a one-tier chain (the edge
// client and one healthy server, over bufconn): the cost of the stack's
// client and server interceptors on a call that succeeds at once. The
// sub-benchmarks are named stack=NAME, "none" first, so that
//
//	benchstat -col /stack out.txt
//
// prints every stack relative to no interceptor.

var oneTier = []string{"payment"}

func chainFor(b *testing.B, s Stack) *testsvc.Chain {
	b.Helper()
	inst, err := s.New(oneTier, 1)
	if err != nil {
		b.Fatal(err)
	}
	c := testsvc.New(b, inst.Config)
	if err := warm(c); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkUnary: one unary call per op.
func BenchmarkUnary(b *testing.B) {
	for _, s := range Stacks() {
		b.Run("stack="+s.Name, func(b *testing.B) {
			unaryParallel(b, chainFor(b, s))
		})
	}
}

// unaryParallel measures one unary call per op on c, from parallel
// goroutines, each call with a deadline.
func unaryParallel(b *testing.B, c *testsvc.Chain) {
	b.Helper()
	cl := c.Client()
	req := &testsvcv1.UnaryRequest{Id: "x", Payload: make([]byte, 64)}
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
}

// BenchmarkBidi: one bidi stream per op, 100 messages each way, each
// request answered before the next is sent. Stacks without a bidi stream
// interceptor (go-grpc-middleware's refuses bidi streams, failsafegrpc has
// none) are skipped.
func BenchmarkBidi(b *testing.B) {
	for _, s := range Stacks() {
		b.Run("stack="+s.Name, func(b *testing.B) {
			if !s.Streams {
				b.Skipf("%s has no interceptor for bidi streams", s.Name)
			}
			cl := chainFor(b, s).Client()
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
