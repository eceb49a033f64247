package reliability

import (
	"context"
	"flag"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/testsvc"
)

var longFlag = flag.Bool("reliability.long", false, "run the long form of the reliability suite (also STORMGUARD_RELIABILITY_LONG=1)")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// long reports whether the long form was asked for.
func long() bool { return *longFlag || os.Getenv("STORMGUARD_RELIABILITY_LONG") == "1" }

// size returns short in the short form and long in the long form.
func size[T any](short, long_ T) T {
	if long() {
		return long_
	}
	return short
}

// ctxT returns a context bounded by d that ends with the test.
func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// watchdog returns a context that ends with the test, or 30 s before
// go test's -timeout would end the test binary, so that a deadlock fails
// the test with a message instead of a panic. It bounds no RPC: each has
// its own deadline. Without a -timeout it ends after 10 minutes.
func watchdog(t *testing.T) context.Context {
	t.Helper()
	dl, ok := t.Deadline()
	if !ok {
		return ctxT(t, 10*time.Minute)
	}
	ctx, cancel := context.WithDeadline(context.Background(), dl.Add(-30*time.Second))
	t.Cleanup(cancel)
	return ctx
}

// frozen is a clock that never moves: budgets and breakers then decide on
// counts alone, so the bounds the tests check are exact.
func frozen() *clock.Fake { return clock.NewFake(time.Unix(1_000_000, 0)) }

// stack describes the stormguard stack put on every hop of a chain.
type stack struct {
	budget  budget.Config
	breaker breaker.Config
	opts    []interceptor.Option // more client options
	// rawEdge leaves the edge client (hop 0) without stormguard, for a
	// client that forges its own metadata.
	rawEdge bool
	// server returns more server interceptors for tier i, installed after
	// stormguard's.
	server func(tier int) []grpc.UnaryServerInterceptor
}

// fullChain starts the testsvc chain with the full stormguard stack on
// every hop (budget and breaker, fresh per hop, as separate processes
// would have) and the server interceptors on every tier.
func fullChain(t *testing.T, seed uint64, s stack) *testsvc.Chain {
	t.Helper()
	srv, err := interceptor.New()
	if err != nil {
		t.Fatal(err)
	}
	return testsvc.New(t, testsvc.Config{
		Seed: seed,
		DialOptions: func(hop int) []grpc.DialOption {
			if hop == 0 && s.rawEdge {
				return nil
			}
			set, err := breaker.NewSet(s.breaker, 0)
			if err != nil {
				t.Fatal(err)
			}
			opts := append([]interceptor.Option{interceptor.WithBudget(s.budget), interceptor.WithBreaker(set)}, s.opts...)
			i, err := interceptor.New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			return i.DialOptions()
		},
		ServerOptions: func(tier int) []grpc.ServerOption {
			if s.server == nil {
				return srv.ServerOptions()
			}
			return []grpc.ServerOption{
				grpc.ChainUnaryInterceptor(append([]grpc.UnaryServerInterceptor{srv.UnaryServer()}, s.server(tier)...)...),
				grpc.ChainStreamInterceptor(srv.StreamServer()),
			}
		},
	})
}

// waitReady waits, bounded by ctx, until every hop of c is connected.
func waitReady(t *testing.T, ctx context.Context, c *testsvc.Chain) {
	t.Helper()
	for i := range c.Tiers() {
		conn := c.Conn(i)
		for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
			conn.Connect()
			if !conn.WaitForStateChange(ctx, s) {
				t.Fatalf("hop %d did not connect", i)
			}
		}
	}
}
