package reliability

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/testsvc"
)

// TestFlappingSoak runs closed-loop users while payment flaps down and up
// every 150 ms, with budgets and breakers on the real clock (so breakers
// open, probe and close for real). What it checks does not depend on the
// timing: every RPC ends, with success or UNAVAILABLE; the counts add up;
// no hop sends more attempts than configured, and only order retries; the
// goroutines stay within what the in-flight RPCs need; and none is left
// behind once the load stops.
//
// Goroutines are counted at a fixed point of every RPC that payment
// serves, where its whole chain is in flight (not on a timer that can miss
// the peak). A chain in flight holds one handler goroutine per tier, 3;
// the bound allows each of the 16 users twice that, for the transient
// goroutines of grpc-go and of timers (measured: at most about 4.2 per
// user, on a loaded machine). A goroutine leaked per RPC, per attempt or
// per backoff would pass it within the first few hundred of the tens of
// thousands of RPCs.
func TestFlappingSoak(t *testing.T) {
	const users = 16
	duration := size(3*time.Second, 30*time.Second)
	const perUser = 6
	var peak atomic.Int64
	sample := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		n := int64(runtime.NumGoroutine())
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		return h(ctx, req)
	}
	c := fullChain(t, 3, stack{opts: []interceptor.Option{fastBackoff}, server: func(tier int) []grpc.UnaryServerInterceptor {
		if tier == 2 { // payment
			return []grpc.UnaryServerInterceptor{sample}
		}
		return nil
	}})
	ctx := ctxT(t, duration+2*time.Minute)
	waitReady(t, ctx, c)
	pay, order, gw := c.Tier("payment"), c.Tier("order"), c.Tier("gateway")

	base := int64(runtime.NumGoroutine())
	stop := make(chan struct{})
	flapped := make(chan struct{})
	// The flapper is the clock of the soak: it ends the load after
	// duration.
	go func() {
		defer close(flapped)
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		end := time.NewTimer(duration)
		defer end.Stop()
		down := false
		for {
			select {
			case <-end.C:
				pay.SetUp()
				close(stop)
				return
			case <-tick.C:
				if down = !down; down {
					pay.SetDown(codes.Unavailable)
				} else {
					pay.SetUp()
				}
			}
		}
	}()

	var (
		res outcome
		wg  sync.WaitGroup
		n   int64
		mu  sync.Mutex
	)
	for u := range users {
		wg.Go(func() {
			cl := c.Client()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				n++
				mu.Unlock()
				res.record(ctx, cl, strconv.Itoa(u)+"-"+strconv.Itoa(i), 30*time.Second)
			}
		})
	}
	waitAll(t, ctx, &wg, "flapping soak")
	<-flapped

	for code, k := range res.codes() {
		if code != codes.OK && code != codes.Unavailable {
			t.Errorf("%d RPCs ended with %v, want OK or Unavailable only", k, code)
		}
	}
	ok := res.ok.Load()
	t.Logf("%d RPCs, %d succeeded; received gateway %d, order %d, payment %d; goroutines %d at the start, peak %d",
		n, ok, gw.Received(testsvc.Unary), order.Received(testsvc.Unary), pay.Received(testsvc.Unary), base, peak.Load())
	if m := res.mismatch.Load(); m != 0 {
		t.Errorf("%d responses carried another request's id", m)
	}
	checkCounts(t, c, ok)
	// The edge never retries (an open breaker of its own may even spare
	// gateway the call); gateway never retries.
	if got := gw.Attempts(testsvc.Unary); got > n {
		t.Errorf("the edge sent %d attempts for %d RPCs", got, n)
	}
	if got, max := order.Attempts(testsvc.Unary), gw.Received(testsvc.Unary); got > max {
		t.Errorf("gateway sent %d attempts for the %d calls it received", got, max)
	}
	if got, max := pay.Attempts(testsvc.Unary), interceptor.DefaultMaxAttempts*order.Received(testsvc.Unary); got > max {
		t.Errorf("order sent %d attempts, more than %d", got, max)
	}
	if peak.Load() == 0 {
		t.Fatal("payment served no RPC during the soak: nothing was sampled")
	}
	if limit := base + users*perUser; peak.Load() > limit {
		t.Errorf("peak of %d goroutines during the soak, want <= %d (%d at rest, %d per user, %d users)",
			peak.Load(), limit, base, perUser, users)
	}
	// Once every RPC has ended, the goroutines go back to about the level
	// at rest (which itself moves by a few as connections' goroutines
	// come and go); timers and contexts may take a moment to wind down,
	// so wait for it, bounded by the test's context. One goroutine left
	// behind per thousand RPCs would exceed it.
	for g := int64(runtime.NumGoroutine()); g > base+users; g = int64(runtime.NumGoroutine()) {
		select {
		case <-ctx.Done():
			t.Fatalf("%d goroutines after the soak, want at most %d (%d at rest + %d)", g, base+users, base, users)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
