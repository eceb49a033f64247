package interceptor

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// happyStacks are the configurations the happy-path benchmarks compare,
// on a bare chain (no interceptor of the harness's own) of the given tiers
// over bufconn: no interceptor, Recommended(), and the budget-and-breaker
// stack; each tier gets its own interceptors, as separate processes would.
func happyStacks(tiers []string) map[string]testsvc.Config {
	stack := func(opts func() []Option) testsvc.Config {
		return testsvc.Config{
			Tiers:         tiers,
			Bare:          true,
			DialOptions:   func(int) []grpc.DialOption { return DialOptions(opts()...) },
			ServerOptions: func(int) []grpc.ServerOption { return ServerOptions(opts()...) },
		}
	}
	noop := testsvc.Config{
		Tiers: tiers,
		Bare:  true,
		DialOptions: func(int) []grpc.DialOption {
			return []grpc.DialOption{grpc.WithChainUnaryInterceptor(noopUnaryClient), grpc.WithChainStreamInterceptor(noopStreamClient)}
		},
		ServerOptions: func(int) []grpc.ServerOption {
			return []grpc.ServerOption{grpc.ChainUnaryInterceptor(noopUnaryServer), grpc.ChainStreamInterceptor(noopStreamServer)}
		},
	}
	return map[string]testsvc.Config{
		"none":        {Tiers: tiers, Bare: true},
		"noop":        noop,
		"recommended": stack(Recommended),
		"breaker": stack(func() []Option {
			set, _ := breaker.NewSet(breaker.Config{}, 0)
			return []Option{WithBudget(budget.Config{}), WithBreaker(set)}
		}),
		// Hedging configured with a delay no healthy call reaches: what
		// a hedging call costs when it sends no hedge.
		"recommended-hedging": stack(func() []Option {
			return append(Recommended(), WithHedging(Hedging{Delay: time.Second}))
		}),
	}
}

var happyNames = []string{"none", "noop", "recommended", "breaker", "recommended-hedging"}

// The noop stack's interceptors pass every call through: what grpc-go
// itself charges for any client and server interceptor, the floor under
// every stack.
func noopUnaryClient(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(ctx, method, req, reply, cc, opts...)
}

func noopStreamClient(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(ctx, desc, cc, method, opts...)
}

func noopUnaryServer(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return handler(ctx, req)
}

func noopStreamServer(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, ss)
}

// BenchmarkUnaryHappyPath measures what stormguard costs on a healthy
// call, one tier (the edge client and one server): client and server
// interceptors of Recommended() and of the breaker stack, against none and
// against pass-through interceptors (noop).
func BenchmarkUnaryHappyPath(b *testing.B) {
	unaryHappy(b, happyStacks([]string{"payment"}))
}

// BenchmarkChainHappyPath is BenchmarkUnaryHappyPath through the
// gateway -> order -> payment chain, where every hop carries the attempt
// metadata.
func BenchmarkChainHappyPath(b *testing.B) {
	unaryHappy(b, happyStacks(nil))
}

func unaryHappy(b *testing.B, stacks map[string]testsvc.Config) {
	for _, name := range happyNames {
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
	stacks := happyStacks([]string{"payment"})
	for _, name := range happyNames {
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

// BenchmarkMiddleHop is one hop of a middle tier without a transport:
// the server interceptor of the request it serves, the client
// interceptor of its call below, and the server interceptor of the tier
// below (the invoker passes the attempt's metadata on as gRPC would), with
// handlers that do nothing. It is what a tier's own interceptors cost per
// request, free of the network and of grpc-go's work, against the
// pass-through interceptors (noop).
func BenchmarkMiddleHop(b *testing.B) {
	for _, tc := range []struct {
		name   string
		client grpc.UnaryClientInterceptor
		server grpc.UnaryServerInterceptor
	}{
		{"noop", noopUnaryClient, noopUnaryServer},
		{"recommended", nil, nil},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cl, sv := tc.client, tc.server
			if cl == nil {
				i, err := New(Recommended()...)
				if err != nil {
					b.Fatal(err)
				}
				cl, sv = i.UnaryClient(), i.UnaryServer()
			}
			cc := newCC(b)
			info := &grpc.UnaryServerInfo{FullMethod: "/svc/M"}
			leaf := func(context.Context, any) (any, error) { return nil, nil }
			invoker := func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				md, _ := metadata.FromOutgoingContext(ctx)
				_, err := sv(metadata.NewIncomingContext(context.Background(), md), nil, info, leaf)
				return err
			}
			handler := func(ctx context.Context, _ any) (any, error) {
				return nil, cl(ctx, "/svc/M", nil, nil, cc, invoker)
			}
			ctx, cancel := context.WithTimeout(metadata.NewIncomingContext(context.Background(), metadata.Pairs(MetadataDepth, "1")), time.Hour)
			defer cancel()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := sv(ctx, nil, info, handler); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
