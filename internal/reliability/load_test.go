package reliability

import (
	"context"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// fastBackoff keeps the waits between attempts short: the counts these
// tests check do not depend on them.
var fastBackoff = interceptor.WithBackoff(interceptor.Backoff{Base: time.Millisecond, Cap: 5 * time.Millisecond})

// outcome is what the users of a load saw.
type outcome struct {
	ok       atomic.Int64
	byCode   sync.Map // codes.Code -> *atomic.Int64
	mismatch atomic.Int64
}

func (o *outcome) add(code codes.Code) {
	v, _ := o.byCode.LoadOrStore(code, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (o *outcome) codes() map[codes.Code]int64 {
	m := map[codes.Code]int64{}
	o.byCode.Range(func(k, v any) bool {
		m[k.(codes.Code)] = v.(*atomic.Int64).Load()
		return true
	})
	return m
}

// record sends one request with its own deadline and records the outcome.
func (o *outcome) record(ctx context.Context, cl testsvcv1.TestServiceClient, id string, deadline time.Duration) {
	rctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	resp, err := cl.Unary(rctx, &testsvcv1.UnaryRequest{Id: id})
	code := status.Code(err)
	o.add(code)
	if err == nil {
		o.ok.Add(1)
		if resp.GetId() != id {
			o.mismatch.Add(1)
		}
	}
}

// burst releases n RPCs at once, ids "0" to n-1, each with its own
// deadline, and waits (bounded by ctx) until all have ended.
func burst(t *testing.T, ctx context.Context, cl testsvcv1.TestServiceClient, n int, deadline time.Duration, what string) *outcome {
	t.Helper()
	var (
		res   outcome
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for i := range n {
		wg.Go(func() {
			<-start
			res.record(ctx, cl, strconv.Itoa(i), deadline)
		})
	}
	close(start)
	waitAll(t, ctx, &wg, what)
	return &res
}

// flow sends n RPCs, ids "0" to n-1, keeping inFlight of them in flight
// until all are sent; each has its own deadline, from when it is sent. It
// waits (bounded by ctx) until all have ended. Unlike burst, the time an
// RPC waits for the others is bounded by inFlight, not by n, so that a
// loaded machine meets the deadline.
func flow(t *testing.T, ctx context.Context, cl testsvcv1.TestServiceClient, n, inFlight int, deadline time.Duration, what string) *outcome {
	t.Helper()
	var (
		res   outcome
		next  atomic.Int64
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for range inFlight {
		wg.Go(func() {
			<-start
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				res.record(ctx, cl, strconv.FormatInt(i, 10), deadline)
			}
		})
	}
	close(start)
	waitAll(t, ctx, &wg, what)
	return &res
}

// waitAll waits for wg, failing the test if ctx ends first: a deadlock or
// an RPC that outlives its deadline shows up here.
func waitAll(t *testing.T, ctx context.Context, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("%s: not every RPC ended before the watchdog (deadlock or an RPC past its deadline)", what)
	}
}

// checkCounts checks the invariants that hold on any chain whose tiers
// were never killed and whose calls never outlived their deadline: every
// attempt a hop sent arrived at its tier (nothing lost between tiers), and
// every tier answered with success exactly as many calls as the users saw
// succeed (nothing lost, nothing doubled on the way back).
func checkCounts(t *testing.T, c *testsvc.Chain, ok int64) {
	t.Helper()
	for _, tier := range c.Tiers() {
		got, sent := tier.Received(testsvc.Unary), tier.Attempts(testsvc.Unary)
		if got != sent {
			t.Errorf("%s received %d calls, the hop in front sent %d attempts", tier.Name(), got, sent)
		}
		if succeeded := got - tier.Failed(); succeeded != ok {
			t.Errorf("%s answered %d calls with success, users saw %d successes", tier.Name(), succeeded, ok)
		}
	}
}

// TestConcurrentRPCs sends 10k RPCs through the full stack, 200 of them
// in flight at any time, with payment failing 20 % of calls at random
// (seeded). Budgets and breakers run on a frozen clock, so their bounds
// are exact. Each RPC has 2 minutes from when it is sent, and waits for at
// most 199 others. Released all at once, with their deadlines started
// together, the last RPCs waited for all the others: on a machine at load
// average 20, 6 608 of them ran out of time before their turn. (With 200
// in flight the test also does less work: 14 s instead of 44 s, 12 s of
// CPU instead of 20, at load average 5.)
func TestConcurrentRPCs(t *testing.T) {
	const n, inFlight = 10_000, 200
	rounds := size(1, 5)
	for round := range rounds {
		t.Run("round="+strconv.Itoa(round), func(t *testing.T) {
			fc := frozen()
			c := fullChain(t, uint64(7+round), stack{
				budget:  budget.Config{Clock: fc},
				breaker: breaker.Config{Clock: fc},
				opts:    []interceptor.Option{fastBackoff},
			})
			ctx := watchdog(t)
			waitReady(t, ctx, c)
			pay, order, gw := c.Tier("payment"), c.Tier("order"), c.Tier("gateway")
			pay.SetFlaky(0.2)

			res := flow(t, ctx, c.Client(), n, inFlight, 2*time.Minute, "10k RPCs, 200 in flight")

			codes_ := res.codes()
			var total int64
			for code, k := range codes_ {
				total += k
				if code != codes.OK && code != codes.Unavailable {
					t.Errorf("%d RPCs ended with %v, want OK or Unavailable only", k, code)
				}
			}
			if total != n {
				t.Fatalf("%d RPCs ended, %d were sent", total, n)
			}
			if m := res.mismatch.Load(); m != 0 {
				t.Errorf("%d responses carried another request's id", m)
			}
			ok := res.ok.Load()
			t.Logf("%d of %d succeeded; received gateway %d, order %d, payment %d", ok, n,
				gw.Received(testsvc.Unary), order.Received(testsvc.Unary), pay.Received(testsvc.Unary))
			checkCounts(t, c, ok)

			// Only order retries: a tier that gives up tells the one above
			// not to retry, so the edge and gateway send one attempt per
			// call.
			if got := gw.Attempts(testsvc.Unary); got != n {
				t.Errorf("the edge sent %d attempts for %d RPCs, want exactly %d", got, n, n)
			}
			if got, want := order.Attempts(testsvc.Unary), gw.Received(testsvc.Unary); got != want {
				t.Errorf("gateway sent %d attempts for the %d calls it received, want one each", got, want)
			}
			first := order.Received(testsvc.Unary)
			attempts := pay.Attempts(testsvc.Unary)
			if attempts > interceptor.DefaultMaxAttempts*first {
				t.Errorf("order sent %d attempts for %d calls: more than %d each", attempts, first, interceptor.DefaultMaxAttempts)
			}
			// The budget on a frozen clock: retries <= ceil(0.2 x requests
			// + floor), the floor being 10/s x 10 s.
			retries := attempts - first
			limit := int64(math.Ceil(budget.DefaultRatio*float64(first) + budget.DefaultMinRetriesPerSecond*budget.DefaultWindow.Seconds()))
			if retries > limit {
				t.Errorf("order made %d retries for %d calls, the budget allows %d", retries, first, limit)
			}
		})
	}
}

// TestEveryRPCEndsByItsDeadline holds every call in payment and checks that
// each one ends with DeadlineExceeded (or, once the hangs counted as
// failures opened a breaker, is refused at once with Unavailable), none is
// retried, and none hangs.
func TestEveryRPCEndsByItsDeadline(t *testing.T) {
	n := size(2000, 10_000)
	c := fullChain(t, 1, stack{opts: []interceptor.Option{fastBackoff}})
	ctx := ctxT(t, 3*time.Minute)
	waitReady(t, ctx, c)
	c.Tier("payment").SetLatency(time.Hour)
	res := burst(t, ctx, c.Client(), n, 500*time.Millisecond, "RPCs held in payment")
	byCode := res.codes()
	if dl := byCode[codes.DeadlineExceeded]; dl == 0 || dl+byCode[codes.Unavailable] != int64(n) {
		t.Fatalf("RPCs by code %v, want all %d DeadlineExceeded, or Unavailable from a breaker the hangs opened", byCode, n)
	}
	// The caller's own deadline is never retried.
	for _, tier := range c.Tiers() {
		if got := tier.Attempts(testsvc.Unary); got > int64(n) {
			t.Errorf("%d attempts sent to %s for %d RPCs: a deadline was retried", got, tier.Name(), n)
		}
	}
}
