package interceptor

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// noWait makes retries immediate: the counts of these tests do not depend
// on the waits, and the tests run faster without them.
var noWait = withSleep(func(ctx context.Context, _ time.Duration) error { return ctx.Err() })

// chainSpec puts stormguard on a chain: client options per hop (hop 0 is
// the edge client; nil means no stormguard on that hop) and server options
// for every tier.
type chainSpec struct {
	seed   uint64
	client func(hop int) []Option
	dial   func(hop int) []grpc.DialOption // instead of client, for a hop
	server []Option
}

func startChain(t *testing.T, spec chainSpec) *testsvc.Chain {
	t.Helper()
	return testsvc.New(t, testsvc.Config{
		Seed: spec.seed,
		DialOptions: func(hop int) []grpc.DialOption {
			if spec.dial != nil {
				if d := spec.dial(hop); d != nil {
					return d
				}
			}
			if spec.client == nil {
				return nil
			}
			opts := spec.client(hop)
			if opts == nil {
				return nil
			}
			return mustNew(t, opts...).DialOptions()
		},
		ServerOptions: func(int) []grpc.ServerOption { return mustNew(t, spec.server...).ServerOptions() },
	})
}

func received(c *testsvc.Chain) []int64 {
	var n []int64
	for _, tier := range c.Tiers() {
		n = append(n, tier.Received(testsvc.Unary))
	}
	return n
}

// TestPaymentDownOneRequest is the headline: 27 calls at payment with
// naive retries on every hop (internal/testsvc.TestNaiveRetryStorm), 3 with
// stormguard's defaults on every hop.
func TestPaymentDownOneRequest(t *testing.T) {
	c := startChain(t, chainSpec{client: func(int) []Option { return []Option{noWait} }})
	c.Tier("payment").SetDown(codes.Unavailable)
	var trailer metadata.MD
	_, err := c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "one"}, grpc.Trailer(&trailer))
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("user got %v, want Unavailable", err)
	}
	if got, want := received(c), []int64{1, 1, 3}; !slices.Equal(got, want) {
		t.Fatalf("calls received (gateway, order, payment): got %v, want %v", got, want)
	}
	if got := trailer.Get(MetadataPushback); !slices.Equal(got, []string{"-1"}) {
		t.Fatalf("user's trailer %s: got %v, want [-1]", MetadataPushback, got)
	}
}

// loadResult is what the users of load saw.
type loadResult struct {
	ok, failed int
	latencies  []time.Duration
}

func (r loadResult) success() float64 { return float64(r.ok) / float64(r.ok+r.failed) }

func (r loadResult) percentile(p float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	s := slices.Clone(r.latencies)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// requestDeadline is the deadline of each request that load sends: far
// beyond what a request takes even on a loaded machine (milliseconds), so
// that every failure the tests count is the chain's, and yet a bound on a
// request that hangs.
const requestDeadline = 30 * time.Second

// load sends n requests from users goroutines and reports what the users
// saw. Each request has its own deadline, which starts when it is sent.
// Nothing bounds the run as a whole: a run on a slow machine takes longer
// and every request still counts. (A deadline on the whole run once cut a
// slow run short, and every request after it failed at once: success
// 0.7069 where the chain gave 0.999.) The run is bounded all the same: n
// requests, each ending by its deadline.
func load(t *testing.T, c *testsvc.Chain, n, users int) loadResult {
	t.Helper()
	var (
		next atomic.Int64
		mu   sync.Mutex
		res  loadResult
		wg   sync.WaitGroup
	)
	for range users {
		wg.Go(func() {
			cl := c.Client()
			for next.Add(1) <= int64(n) {
				rctx, cancel := context.WithTimeout(context.Background(), requestDeadline)
				start := time.Now()
				_, err := cl.Unary(rctx, &testsvcv1.UnaryRequest{})
				d := time.Since(start)
				cancel()
				mu.Lock()
				if err == nil {
					res.ok++
				} else {
					res.failed++
				}
				res.latencies = append(res.latencies, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return res
}

// frozen is a clock that never moves: budgets and breakers see one instant,
// so their decisions depend on counts alone, not on how fast the machine is.
func frozen() *clock.Fake { return clock.NewFake(time.Unix(1_000_000, 0)) }

func mustSet(t *testing.T, cfg breaker.Config) *breaker.Set {
	t.Helper()
	s, err := breaker.NewSet(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPaymentDownSustained(t *testing.T) {
	const requests, users = 5000, 32
	tests := []struct {
		name    string
		opts    func() []Option
		maxAmpl float64
	}{
		{"no retries", func() []Option { return []Option{WithMaxAttempts(1)} }, 1},
		{"budget", func() []Option { return []Option{WithBudget(budget.Config{Clock: frozen()})} }, 1.25},
		{"budget and breaker", func() []Option {
			return []Option{WithBudget(budget.Config{Clock: frozen()}), WithBreaker(mustSet(t, breaker.Config{Clock: frozen()}))}
		}, 0.05},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startChain(t, chainSpec{client: func(int) []Option { return tt.opts() }})
			c.Tier("payment").SetDown(codes.Unavailable)
			res := load(t, c, requests, users)
			if res.ok != 0 {
				t.Fatalf("%d requests succeeded with payment down", res.ok)
			}
			pay := c.Tier("payment").Received(testsvc.Unary)
			ampl := float64(pay) / requests
			t.Logf("%s: %d calls at payment for %d requests (%.3f per request); user p50 %v, p99 %v",
				tt.name, pay, requests, ampl, res.percentile(0.5), res.percentile(0.99))
			if ampl > tt.maxAmpl {
				t.Fatalf("calls at payment per user request: got %.3f, want <= %.2f", ampl, tt.maxAmpl)
			}
			// Only order retries: every tier above passes the failure
			// up at once (an open breaker at the edge or at gateway may
			// even spare the tiers below).
			gw, order := c.Tier("gateway"), c.Tier("order")
			if got := gw.Attempts(testsvc.Unary); got > requests {
				t.Fatalf("the edge sent %d attempts for %d requests: it retried", got, requests)
			}
			if got, max := order.Attempts(testsvc.Unary), gw.Received(testsvc.Unary); got > max {
				t.Fatalf("gateway sent %d attempts for the %d calls it received: it retried", got, max)
			}
		})
	}
}

// TestFlaky covers payment failing at random. Only order retries, so a
// user request fails when all of order's 3 attempts do: with p = 0.1 that is
// p^3 = 0.001, an expected success of exactly 99.9 %. The draws are seeded
// but the interleaving of 32 users is not, so the test checks the success
// rate against a bound of five standard deviations around that
// expectation, and the calls per request (1 + p + p^2 = 1.11) against the
// design's 1.12.
func TestFlaky(t *testing.T) {
	tests := []struct {
		name        string
		p           float64
		requests    int
		minSuccess  float64
		maxCallsPer float64
	}{
		{"10 percent", 0.1, 20000, 0.999 - 5*stddev(0.001, 20000), 1.12},
		// 30 %: the budget is the limit. First attempts succeed 70 % of
		// the time; retries are held to 20 % of requests (plus the floor),
		// and succeed 70 % of the time: 0.7 + 0.2 x 0.7 = 0.84.
		{"30 percent", 0.3, 20000, 0.83, 1.25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opened atomic.Int64
			opts := func() []Option {
				return []Option{noWait, WithBudget(budget.Config{Clock: frozen()}), WithBreaker(mustSet(t, breaker.Config{
					OnStateChange: func(_ string, _, to breaker.State) {
						if to == breaker.Open {
							opened.Add(1)
						}
					},
				}))}
			}
			c := startChain(t, chainSpec{seed: 42, client: func(int) []Option { return opts() }})
			c.Tier("payment").SetFlaky(tt.p)
			res := load(t, c, tt.requests, 32)
			pay := c.Tier("payment").Received(testsvc.Unary)
			callsPer := float64(pay) / float64(tt.requests)
			t.Logf("payment flaky at %.0f %%: success %.4f, %.3f calls at payment per request, breaker opened %d times",
				tt.p*100, res.success(), callsPer, opened.Load())
			if res.success() < tt.minSuccess {
				t.Errorf("success: got %.4f, want >= %.4f", res.success(), tt.minSuccess)
			}
			if callsPer > tt.maxCallsPer {
				t.Errorf("calls at payment per request: got %.3f, want <= %.2f", callsPer, tt.maxCallsPer)
			}
			if n := opened.Load(); n != 0 {
				t.Errorf("a breaker opened %d times at %.0f %% random failures, want never", n, tt.p*100)
			}
		})
	}
}

// stddev is the standard deviation of the share of failures among n
// requests that each fail with probability q.
func stddev(q float64, n int) float64 {
	return sqrt(q * (1 - q) / float64(n))
}

// TestGoGRPCMiddlewareEdge: an edge client that retries with
// go-grpc-middleware sends x-retry-attempt; the stormguard tiers behind it
// see its retries and do not retry themselves. The edge ignores the
// pushback and makes 3 attempts; the first reaches payment 3 times (order
// retries), each retry once.
func TestGoGRPCMiddlewareEdge(t *testing.T) {
	c := startChain(t, chainSpec{
		client: func(int) []Option { return []Option{noWait} },
		dial: func(hop int) []grpc.DialOption {
			if hop != 0 {
				return nil
			}
			return []grpc.DialOption{grpc.WithChainUnaryInterceptor(retry.UnaryClientInterceptor(
				retry.WithMax(3), retry.WithBackoff(retry.BackoffLinear(time.Millisecond))))}
		},
	})
	c.Tier("payment").SetDown(codes.Unavailable)
	_, err := c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("user got %v, want Unavailable", err)
	}
	if got, want := received(c), []int64{3, 3, 5}; !slices.Equal(got, want) {
		t.Fatalf("calls received (gateway, order, payment): got %v, want %v", got, want)
	}
}

// TestBuiltinRetryHonoursPushback: grpc-go's own retry policy at the edge
// (maxAttempts 3) stops after one attempt when the gateway answers with
// the don't-retry trailer.
func TestBuiltinRetryHonoursPushback(t *testing.T) {
	const sc = `{"methodConfig":[{"name":[{"service":"stormguard.testsvc.v1.TestService"}],
		"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.001s","maxBackoff":"0.002s",
		"backoffMultiplier":1.0,"retryableStatusCodes":["UNAVAILABLE"]}}]}`
	c := startChain(t, chainSpec{
		client: func(int) []Option { return []Option{noWait} },
		dial: func(hop int) []grpc.DialOption {
			if hop != 0 {
				return nil
			}
			return []grpc.DialOption{grpc.WithDefaultServiceConfig(sc)}
		},
	})
	pay := c.Tier("payment")
	pay.SetDown(codes.Unavailable)
	_, err := c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("user got %v, want Unavailable", err)
	}
	if got, want := received(c), []int64{1, 1, 3}; !slices.Equal(got, want) {
		t.Fatalf("calls received (gateway, order, payment): got %v, want %v (built-in retry ignored the pushback)", got, want)
	}

	// Control: the same edge retries 3 times when the trailer is absent
	// (stormguard only on order, so gateway sends no pushback).
	c2 := startChain(t, chainSpec{
		client: func(hop int) []Option {
			if hop == 2 {
				return []Option{noWait}
			}
			return nil
		},
		dial: func(hop int) []grpc.DialOption {
			if hop != 0 {
				return nil
			}
			return []grpc.DialOption{grpc.WithDefaultServiceConfig(sc)}
		},
		server: nil,
	})
	c2.Tier("payment").SetDown(codes.Unavailable)
	c2.Tier("gateway").SetDown(codes.Unavailable)
	_, _ = c2.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{})
	if got := c2.Tier("gateway").Received(testsvc.Unary); got != 3 {
		t.Fatalf("control: built-in retry made %d attempts, want 3", got)
	}
}

// TestUntrustedCallers: an outside client forges the attempt metadata
// (depth, upstream retries, attempt) at the gateway of a chain whose
// clients use the depth policy [3, 2, 1], with payment down. Honest, the
// chain makes 1/1/2 calls at gateway/order/payment (order, at depth 1, has
// 2 attempts). With WithUntrustedCallers at the edge alone, every
// forgery gives exactly that. Without it, no forgery gives more calls at
// any tier (a forged depth 9 gave 1/1/3 when depths past the list had the
// configured attempts).
func TestUntrustedCallers(t *testing.T) {
	policy := WithTierPolicyConfig(TierPolicyConfig{AttemptsByDepth: []int{3, 2, 1}})
	honest := []int64{1, 1, 2}
	forgeries := map[string]metadata.MD{
		"none":             nil,
		"depth 9":          metadata.Pairs(MetadataDepth, "9"),
		"depth garbage":    metadata.Pairs(MetadataDepth, "garbage"),
		"depth 1":          metadata.Pairs(MetadataDepth, "1"),
		"depth 0":          metadata.Pairs(MetadataDepth, "0"),
		"upstream retries": metadata.Pairs(MetadataUpstreamRetries, "5", MetadataAttempt, "2"),
		"negative":         metadata.Pairs(MetadataDepth, "-1", MetadataAttempt, "-1"),
	}
	for _, untrusted := range []bool{false, true} {
		for name, md := range forgeries {
			t.Run(fmt.Sprintf("untrusted=%v/%s", untrusted, name), func(t *testing.T) {
				c := testsvc.New(t, testsvc.Config{
					DialOptions: func(hop int) []grpc.DialOption {
						if hop == 0 {
							return nil // a plain client that forges headers
						}
						return mustNew(t, noWait, policy).DialOptions()
					},
					ServerOptions: func(tier int) []grpc.ServerOption {
						if untrusted && tier == 0 {
							return mustNew(t, WithUntrustedCallers()).ServerOptions()
						}
						return mustNew(t).ServerOptions()
					},
				})
				c.Tier("payment").SetDown(codes.Unavailable)
				ctx := metadata.NewOutgoingContext(ctxTimeout(t, 10*time.Second), md)
				if _, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{}); status.Code(err) != codes.Unavailable {
					t.Fatalf("got %v, want Unavailable", err)
				}
				got := received(c)
				if untrusted && !slices.Equal(got, honest) {
					t.Fatalf("calls (gateway, order, payment): got %v, want the honest %v", got, honest)
				}
				for i := range got {
					if got[i] > honest[i] {
						t.Fatalf("calls (gateway, order, payment): got %v, more than the honest %v", got, honest)
					}
				}
			})
		}
	}
}

// TestInfoReachesHandlers checks the metadata protocol tier by tier with a
// server interceptor that records what each tier's handler sees.
func TestInfoReachesHandlers(t *testing.T) {
	var mu sync.Mutex
	seen := map[int][]Info{}
	c := testsvc.New(t, testsvc.Config{
		DialOptions: func(int) []grpc.DialOption { return mustNew(t, noWait).DialOptions() },
		ServerOptions: func(tier int) []grpc.ServerOption {
			record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				in, ok := FromContext(ctx)
				if !ok {
					t.Errorf("tier %d: no Info in the handler's context", tier)
				}
				mu.Lock()
				seen[tier] = append(seen[tier], in)
				mu.Unlock()
				return h(ctx, req)
			}
			return []grpc.ServerOption{grpc.ChainUnaryInterceptor(mustNew(t).UnaryServer(), record)}
		},
	})
	c.Tier("payment").SetDown(codes.Unavailable)
	_, _ = c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{})
	want := map[int][]Info{
		0: {{Depth: 0}},
		1: {{Depth: 1}},
		// payment is down before its handler runs: nothing recorded.
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("Info per tier: got %v, want %v", seen, want)
	}
}

// TestRecoveryAfterRestart kills payment, lets order's breaker open, brings
// payment back, and counts the simulated time until users succeed again.
// The breaker's clock is fake, so "time" here is exact: the test advances it
// in steps and sends a batch of requests per step.
func TestRecoveryAfterRestart(t *testing.T) {
	fc := frozen()
	set := mustSet(t, breaker.Config{Clock: fc, Rand: func() float64 { return 0.999 }})
	c := startChain(t, chainSpec{client: func(hop int) []Option {
		if hop == 2 {
			return []Option{noWait, WithBreaker(set)}
		}
		return []Option{noWait}
	}})
	pay := c.Tier("payment")
	pay.Kill()
	res := load(t, c, 100, 4)
	if res.ok != 0 {
		t.Fatalf("%d requests succeeded with payment killed", res.ok)
	}
	var brk *breaker.Breaker
	set.Range(func(_ string, b *breaker.Breaker) bool { brk = b; return false })
	if brk == nil || brk.State() != breaker.Open {
		t.Fatalf("order's breaker for payment did not open")
	}
	interval := brk.Snapshot().OpenInterval

	pay.Restart()
	// Wait, bounded, until order's connection to payment is back: the
	// reconnect runs on real time, outside the breaker's clock.
	ctx := ctxTimeout(t, 10*time.Second)
	conn := c.Conn(2)
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		conn.Connect()
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatal("order did not reconnect to payment")
		}
	}

	const step = 50 * time.Millisecond
	var elapsed time.Duration
	for elapsed = 0; elapsed <= 4*interval; elapsed += step {
		r := load(t, c, 100, 4)
		if r.success() >= 0.99 {
			break
		}
		fc.Advance(step)
	}
	limit := 2 * time.Duration(float64(interval)*1.2) // two open intervals, with the largest jitter
	t.Logf("success back to >= 99 %% after %v of breaker time (open interval %v)", elapsed, interval)
	if elapsed > limit {
		t.Fatalf("recovery took %v, want <= %v (two open intervals)", elapsed, limit)
	}
}

// TestChainOfBreakersRecovers: with a breaker on every hop, a long payment
// outage grows only the open interval of order's breaker (its probes really
// fail); the breakers above see "do not retry" answers from a live tier and
// stay at their first interval. After payment is back, users succeed again
// within two of order's open intervals. The breakers share one fake clock,
// which the test moves in steps.
func TestChainOfBreakersRecovers(t *testing.T) {
	fc := frozen()
	sets := make([]*breaker.Set, 3)
	for hop := range sets {
		sets[hop] = mustSet(t, breaker.Config{Clock: fc, Rand: func() float64 { return 0.5 }})
	}
	c := startChain(t, chainSpec{client: func(hop int) []Option {
		return []Option{noWait, WithBreaker(sets[hop])}
	}})
	state := func(hop int) breaker.Snapshot {
		var s breaker.Snapshot
		sets[hop].Range(func(_ string, b *breaker.Breaker) bool { s = b.Snapshot(); return false })
		return s
	}
	pay := c.Tier("payment")
	pay.SetDown(codes.Unavailable)
	load(t, c, 400, 4)
	for hop := range 3 {
		if s := state(hop); s.State != breaker.Open {
			t.Fatalf("hop %d: breaker %v after the outage began, want open", hop, s.State)
		}
	}
	// A long outage: order's probes fail again and again.
	for range 4 {
		fc.Advance(state(2).OpenInterval)
		load(t, c, 20, 4)
	}
	order, gateway, edge := state(2).OpenInterval, state(1).OpenInterval, state(0).OpenInterval
	if order != 16*time.Second || gateway != time.Second || edge != time.Second {
		t.Fatalf("open intervals (edge, gateway, order): got %v, %v, %v; want 1s, 1s, 16s", edge, gateway, order)
	}

	pay.SetUp()
	const step = 250 * time.Millisecond
	var elapsed time.Duration
	for ; elapsed <= 4*order; elapsed += step {
		if r := load(t, c, 20, 4); r.success() >= 0.99 {
			break
		}
		fc.Advance(step)
	}
	t.Logf("success back to >= 99 %% after %v of breaker time (order's open interval %v)", elapsed, order)
	if elapsed > 2*order {
		t.Fatalf("recovery took %v, want <= %v (two of order's open intervals)", elapsed, 2*order)
	}
}
