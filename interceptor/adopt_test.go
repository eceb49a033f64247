package interceptor

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// The tests of this file back the numbers of docs/adopting.md: what goes
// wrong when a chain is wired halfway, and what to do instead.

// oneRequest sends one user request through c with payment down and
// returns the calls each tier received.
func oneRequest(t *testing.T, c *testsvc.Chain) []int64 {
	t.Helper()
	c.Tier("payment").SetDown(codes.Unavailable)
	_, _ = c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{})
	return received(c)
}

// TestHandlerDropsContext: stormguard on every hop, but the handlers call
// the next tier with a context of their own instead of the request's (here
// a fresh context with a timeout, as a handler that wants "its own"
// deadline would make). The attempt metadata and the "do not retry" mark
// travel in the request's context, so every tier behaves as an edge: the
// full storm of 3 / 9 / 27 is back. The sign of it in the metrics: order,
// which is never the edge, receives requests at depth 0 (its
// stormguard.server.request.depth), where passing ctx on gives depth 1.
func TestHandlerDropsContext(t *testing.T) {
	dropCtx := func(_ context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return h(ctx, req)
	}
	depths := make(chan int, 100)
	recordOrder := func(tier int) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if in, ok := FromContext(ctx); ok && tier == 1 {
				depths <- in.Depth
			}
			return h(ctx, req)
		}
	}
	for _, drop := range []bool{true, false} {
		c := testsvc.New(t, testsvc.Config{
			DialOptions: func(int) []grpc.DialOption { return mustNew(t, noWait).DialOptions() },
			ServerOptions: func(tier int) []grpc.ServerOption {
				is := []grpc.UnaryServerInterceptor{mustNew(t).UnaryServer(), recordOrder(tier)}
				if drop {
					is = append(is, dropCtx)
				}
				return []grpc.ServerOption{grpc.ChainUnaryInterceptor(is...)}
			},
		})
		want, wantDepth := []int64{1, 1, 3}, 1
		if drop {
			want, wantDepth = []int64{3, 9, 27}, 0
		}
		if got := oneRequest(t, c); !slices.Equal(got, want) {
			t.Fatalf("handlers drop ctx %v: calls received (gateway, order, payment): got %v, want %v", drop, got, want)
		}
		if len(depths) == 0 {
			t.Fatalf("handlers drop ctx %v: order recorded no request", drop)
		}
		for n := len(depths); n > 0; n-- {
			if d := <-depths; d != wantDepth {
				t.Fatalf("handlers drop ctx %v: order received a request at depth %d, want %d", drop, d, wantDepth)
			}
		}
	}
}

// TestBuiltinRetryUnderInterceptor: stormguard's interceptor installed by
// hand on order's connection, next to a service config with a retry
// policy (maxAttempts 3), without grpc.WithDisableRetry: grpc-go retries
// each of stormguard's attempts underneath it, unseen, and payment gets
// 3 x 3 = 9 calls. DialOptions, which disables grpc-go's retry, gives 3.
func TestBuiltinRetryUnderInterceptor(t *testing.T) {
	const sc = `{"methodConfig":[{"name":[{"service":"stormguard.testsvc.v1.TestService"}],
		"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.001s","maxBackoff":"0.002s",
		"backoffMultiplier":1.0,"retryableStatusCodes":["UNAVAILABLE"]}}]}`
	for _, tt := range []struct {
		name string
		dial func() []grpc.DialOption
		want []int64
	}{
		{"by hand", func() []grpc.DialOption {
			return []grpc.DialOption{grpc.WithDefaultServiceConfig(sc), grpc.WithChainUnaryInterceptor(mustNew(t, noWait).UnaryClient())}
		}, []int64{1, 1, 9}},
		{"DialOptions", func() []grpc.DialOption {
			return append([]grpc.DialOption{grpc.WithDefaultServiceConfig(sc)}, mustNew(t, noWait).DialOptions()...)
		}, []int64{1, 1, 3}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := startChain(t, chainSpec{
				client: func(int) []Option { return []Option{noWait} },
				dial: func(hop int) []grpc.DialOption {
					if hop != 2 {
						return nil
					}
					return tt.dial()
				},
			})
			if got := oneRequest(t, c); !slices.Equal(got, tt.want) {
				t.Fatalf("calls received (gateway, order, payment): got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestPerAttemptTimeoutPlacement: payment answers after 5 s, longer than
// any per-attempt timeout below. The same 500 ms per-attempt timeout on
// every hop moves the retries to the edge: the edge's attempt times out
// first, and the tiers below, whose attempt deadline is their caller's,
// may not retry; so only the edge retries, and each of its attempts
// travels all the way (3 / 3 / 3). On order alone, the tier next to
// payment, order retries (1 / 1 / 3); outer timeouts longer than
// everything below (edge 5 s, gateway 3 s, order 500 ms) keep it so.
//
// The counts are exact: an attempt whose server's deadline (propagated in
// grpc-timeout) fires a moment before the client's own timer is still the
// attempt's own timeout (TestServerDeadlineFiresFirst), where it once cut
// about one run in four short (2 / 2 / 2, or 1 / 1 / 1). The timeouts are
// long enough for every attempt to reach payment on a loaded machine (a
// request took up to 56 ms through the three hops under -race at load
// average 13; with 100 ms per attempt, runs on a busier machine came out
// 3 / 2 / 1), and the counts are read once the chain has settled.
func TestPerAttemptTimeoutPlacement(t *testing.T) {
	const ms = time.Millisecond
	for _, tt := range []struct {
		name     string
		timeouts [3]time.Duration // per hop: edge, gateway, order
		want     []int64          // calls received: gateway, order, payment
	}{
		{"equal on every hop", [3]time.Duration{500 * ms, 500 * ms, 500 * ms}, []int64{3, 3, 3}},
		{"order only", [3]time.Duration{0, 0, 500 * ms}, []int64{1, 1, 3}},
		{"decreasing inwards", [3]time.Duration{5000 * ms, 3000 * ms, 500 * ms}, []int64{1, 1, 3}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := startChain(t, chainSpec{client: func(hop int) []Option {
				return []Option{noWait, WithPerAttemptTimeout(tt.timeouts[hop])}
			}})
			c.Tier("payment").SetLatency(5 * time.Second)
			_, err := c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{})
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("user got %v, want DeadlineExceeded", err)
			}
			waitSettled(t, c, tt.want)
		})
	}
}

// waitSettled waits until every tier of c has received want calls (gateway,
// order, payment), every attempt sent to a tier has arrived, and every tier
// has answered all its calls (with an error: none succeeds here), so that
// nothing more can arrive; it fails at once when a tier receives more than
// want, and after 10 s. The user's call may return before the last attempts
// below it arrive: each tier's deadline starts when a request arrives, so a
// tier can still send after the tier above it gave up.
func waitSettled(t *testing.T, c *testsvc.Chain, want []int64) {
	t.Helper()
	ctx := ctxTimeout(t, 10*time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		got, settled := received(c), true
		for i, tier := range c.Tiers() {
			if got[i] > want[i] {
				t.Fatalf("calls received (gateway, order, payment): got %v, want %v", got, want)
			}
			settled = settled && got[i] == want[i] && tier.Attempts(testsvc.Unary) == got[i] && tier.Failed() == got[i]
		}
		if settled {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("calls received (gateway, order, payment): got %v, want %v, and still so after 10 s", got, want)
		case <-tick.C:
		}
	}
}

// TestAdoptTierByTier: the steps of docs/adopting.md, with
// go-grpc-middleware's retry (WithMax(3)) on the hops not yet migrated and
// stormguard's server interceptors on every tier from the first step.
// Migrating order's client first (the tier next to payment) gives 3 / 9 /
// 15: order retries only the first attempt of each of gateway's calls,
// since go-grpc-middleware's retries carry x-retry-attempt; then gateway's
// client, 3 / 3 / 5 (the edge's retries ignore the pushback, but order and
// gateway see them and make one attempt each); then the edge, 1 / 1 / 3.
func TestAdoptTierByTier(t *testing.T) {
	ggm := []grpc.DialOption{grpc.WithChainUnaryInterceptor(retry.UnaryClientInterceptor(
		retry.WithMax(3), retry.WithBackoff(retry.BackoffLinear(time.Millisecond))))}
	for _, tt := range []struct {
		name       string
		stormguard int // hops from the inside on stormguard: 1 is order's client only
		want       []int64
	}{
		{"none", 0, []int64{3, 9, 27}},
		{"order", 1, []int64{3, 9, 15}},
		{"order and gateway", 2, []int64{3, 3, 5}},
		{"every hop", 3, []int64{1, 1, 3}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := startChain(t, chainSpec{
				client: func(int) []Option { return []Option{noWait} },
				dial: func(hop int) []grpc.DialOption {
					if hop < 3-tt.stormguard {
						return ggm
					}
					return nil // stormguard's, from client
				},
			})
			if got := oneRequest(t, c); !slices.Equal(got, tt.want) {
				t.Fatalf("calls received (gateway, order, payment): got %v, want %v", got, tt.want)
			}
		})
	}
}
