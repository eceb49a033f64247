package reliability

import (
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/testsvc"
)

// TestFlappingSoak runs closed-loop users while payment flaps down and up
// every 150 ms, with budgets and breakers on the real clock (so breakers
// open, probe and close for real). What it checks does not depend on the
// timing: every RPC ends, with success or UNAVAILABLE; the counts add up;
// no hop sends more attempts than configured, and only order retries; and
// the number of goroutines stays bounded throughout.
func TestFlappingSoak(t *testing.T) {
	const users = 16
	duration := size(3*time.Second, 30*time.Second)
	c := fullChain(t, 3, stack{opts: []interceptor.Option{fastBackoff}})
	ctx := ctxT(t, duration+2*time.Minute)
	waitReady(t, ctx, c)
	pay, order, gw := c.Tier("payment"), c.Tier("order"), c.Tier("gateway")

	base := runtime.NumGoroutine()
	stop := make(chan struct{})
	flapped := make(chan int)
	// The flapper is the clock of the soak: it ends the load after
	// duration.
	go func() {
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		end := time.NewTimer(duration)
		defer end.Stop()
		down, peak := false, 0
		for {
			select {
			case <-end.C:
				pay.SetUp()
				close(stop)
				flapped <- peak
				return
			case <-tick.C:
				if down = !down; down {
					pay.SetDown(codes.Unavailable)
				} else {
					pay.SetUp()
				}
				peak = max(peak, runtime.NumGoroutine())
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
	peak := <-flapped

	for code, k := range res.codes() {
		if code != codes.OK && code != codes.Unavailable {
			t.Errorf("%d RPCs ended with %v, want OK or Unavailable only", k, code)
		}
	}
	ok := res.ok.Load()
	t.Logf("%d RPCs, %d succeeded; received gateway %d, order %d, payment %d; goroutines %d at the start, peak %d",
		n, ok, gw.Received(testsvc.Unary), order.Received(testsvc.Unary), pay.Received(testsvc.Unary), base, peak)
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
	// Each in-flight RPC holds a bounded number of goroutines (client and
	// server of three hops); the bound is generous but fixed.
	if limit := base + users*40; peak > limit {
		t.Errorf("peak of %d goroutines during the soak, want <= %d", peak, limit)
	}
}
