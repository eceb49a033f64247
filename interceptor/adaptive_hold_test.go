package interceptor

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/internal/clock"
)

// downTarget returns interceptors with a throttle set whose Hold is hold,
// the permit of an attempt still in flight (a straggler), and the
// throttle of cc's target, down after a cold start's three failures over
// 100 ms.
func downTarget(t *testing.T, hold time.Duration, opts ...Option) (*Interceptors, adaptive.Permit, *fakeInvoker) {
	t.Helper()
	i, straggler, inv, _, _ := downTargetClock(t, hold, opts...)
	return i, straggler, inv
}

// downTargetClock is downTarget that also returns the throttle and its
// clock.
func downTargetClock(t *testing.T, hold time.Duration, opts ...Option) (*Interceptors, adaptive.Permit, *fakeInvoker, *adaptive.Throttle, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set, err := adaptive.NewSet(adaptive.Config{Clock: clk, Rand: func() float64 { return 0.5 }, Hold: hold}, 0)
	if err != nil {
		t.Fatal(err)
	}
	i := mustNew(t, append([]Option{WithAdaptive(set), noWait}, opts...)...)
	th := set.Get("payment")
	straggler, err := th.Allow(false)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		p, err := th.Allow(false)
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(50 * time.Millisecond)
		p.Done(adaptive.Overload)
	}
	if !th.Down() {
		t.Fatal("setup: not down")
	}
	return i, straggler, &fakeInvoker{results: []error{nil}}, th, clk
}

// A first attempt refused because its target is down is held until the
// target answers again (here a straggler is accepted while it waits),
// and then sent: a caller at a fixed concurrency waits instead of
// spinning on refusals, and its request after the outage succeeds instead
// of failing before the first probe says the target is back (issue 19,
// target 5). The hold is long (a second, the most it may be): the answer, not its end, sends
// the call.
func TestHoldUntilBack(t *testing.T) {
	parked := make(chan struct{})
	i, straggler, inv := downTarget(t, time.Second, withHold(func(ctx context.Context, d time.Duration, back <-chan struct{}) error {
		close(parked)
		return holdCtx(ctx, d, back)
	}))
	done := make(chan error, 1)
	go func() {
		done <- i.UnaryClient()(ctxTimeout(t, 10*time.Second), "/svc/M", nil, nil, newCC(t), inv.invoke)
	}()
	<-parked
	straggler.Done(adaptive.Accept)
	if err := <-done; err != nil {
		t.Fatalf("held call after the target came back: %v, want sent and answered", err)
	}
	if len(inv.seen) != 1 {
		t.Fatalf("attempts: %d, want 1", len(inv.seen))
	}
}

// A held call learns what the next probe learns: a probe that fails
// while it waits ends its hold with the refusal, at once, not at the end
// of the hold, whether the target's process is gone (its connection
// broke) or alive and failing (a user's trial: an optional branch of a
// fan-out, killed or failing everything, made every request of an
// aggregator wait the whole 250 ms).
func TestHoldEndsOnFailedProbe(t *testing.T) {
	for _, broken := range []bool{true, false} {
		name := map[bool]string{true: "connection broken", false: "connection ready"}[broken]
		t.Run(name, func(t *testing.T) {
			parked := make(chan struct{})
			var ended string // written before the call returns
			i, _, inv, th, clk := downTargetClock(t, time.Second, withHold(func(ctx context.Context, _ time.Duration, back <-chan struct{}) error {
				close(parked)
				select { // no timer: only the probe's answer ends the hold
				case <-back:
					ended = "back closed"
					return nil
				case <-ctx.Done():
					ended = "deadline"
					return ctx.Err()
				}
			}))
			done := make(chan error, 1)
			go func() {
				done <- i.UnaryClient()(ctxTimeout(t, 2*time.Second), "/svc/M", nil, nil, newCC(t), inv.invoke)
			}()
			<-parked
			var probe adaptive.Permit
			for range 1000 {
				clk.Advance(time.Millisecond)
				if p, err := th.Allow(false); err == nil {
					probe = p
					break
				}
			}
			if !probe.Probe() {
				t.Fatal("no probe in a second of requests")
			}
			th.Connectivity(!broken)
			probe.Done(adaptive.Overload)
			err := <-done
			if ended != "back closed" {
				t.Fatalf("hold ended by %s, want by the failed probe", ended)
			}
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("held call when the probe failed: %v, want UNAVAILABLE (refused)", err)
			}
			if len(inv.seen) != 0 {
				t.Fatalf("attempts sent: %d, want 0", len(inv.seen))
			}
		})
	}
}

// A target that stays down: the call is held for Hold (250 ms by
// default), within its deadline, and then refused as before; a retry is
// never held.
func TestHoldThenRefused(t *testing.T) {
	var holds []time.Duration
	i, _, inv := downTarget(t, 0, withHold(func(_ context.Context, d time.Duration, _ <-chan struct{}) error {
		holds = append(holds, d)
		return nil
	}))
	err := i.UnaryClient()(ctxTimeout(t, 10*time.Second), "/svc/M", nil, nil, newCC(t), inv.invoke)
	var se *Error
	if !errors.As(err, &se) || se.Reason != StopThrottled || len(inv.seen) != 0 {
		t.Fatalf("got %v after %d attempts, want refused by the throttle without an attempt", err, len(inv.seen))
	}
	// Held until the next probe may go (50 ms after the down: the
	// throttle's clock stands still), asked again, and held the rest.
	if want := []time.Duration{50 * time.Millisecond, adaptive.DefaultHold - 50*time.Millisecond}; !slices.Equal(holds, want) {
		t.Fatalf("holds %v, want %v", holds, want)
	}
	holds = nil
	short := fixedLeft{Context: ctxTimeout(t, 10*time.Second), left: 50 * time.Millisecond}
	_ = i.UnaryClient()(short, "/svc/M", nil, nil, newCC(t), inv.invoke)
	if len(holds) != 1 || holds[0] > 50*time.Millisecond {
		t.Fatalf("holds %v with 50 ms left, want one within the deadline", holds)
	}
}

// fixedLeft is a context whose deadline is always left away when asked,
// so that what a test finds left does not depend on how long a busy
// machine took to get there (it ends when its parent does).
type fixedLeft struct {
	context.Context
	left time.Duration
}

func (c fixedLeft) Deadline() (time.Time, bool) { return time.Now().Add(c.left), true }

// A hold within the caller's deadline ends an eighth of the time left
// before it (at least 2 ms), so that the refusal, UNAVAILABLE, reaches
// the callers above before their deadline (the same): held until it,
// a caller with a deadline shorter than the hold got DEADLINE_EXCEEDED
// from every tier, a dead target read as a slow one. With less than
// the margin left, the call is refused at once.
func TestHoldEndsBeforeDeadline(t *testing.T) {
	var holds []time.Duration
	i, _, inv := downTarget(t, 0, withHold(func(_ context.Context, d time.Duration, _ <-chan struct{}) error {
		holds = append(holds, d)
		return nil // the hold ran out: the target is still down
	}))
	for _, tc := range []struct {
		left     time.Duration
		min, max time.Duration // of the hold; max 0: none
	}{
		{left: time.Second, min: adaptive.DefaultHold, max: adaptive.DefaultHold},
		{left: 100 * time.Millisecond, min: 80 * time.Millisecond, max: 88 * time.Millisecond}, // 100 - 12.5
		{left: 10 * time.Millisecond, min: 5 * time.Millisecond, max: 8 * time.Millisecond},    // 10 - 2
		{left: 2 * time.Millisecond},
	} {
		holds = nil
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), tc.left)
		err := i.UnaryClient()(ctx, "/svc/M", nil, nil, newCC(t), inv.invoke)
		cancel()
		// The hold is of the time left when the interceptor looked, which
		// the real clock has shortened by up to what the call took (the
		// holds themselves take none): 3.7 ms in one run of make test.
		took := time.Since(start)
		if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != ThrottledMessage {
			t.Errorf("%v left: got %v, want UNAVAILABLE %q", tc.left, err, ThrottledMessage)
		}
		switch {
		case tc.max == 0 && len(holds) != 0:
			t.Errorf("%v left: held %v, want refused at once", tc.left, holds)
		case tc.max > 0 && (len(holds) > 2 || sum(holds) < tc.min-took || sum(holds) > tc.max):
			t.Errorf("%v left: holds %v, want one or two (until the next probe may go, the rest) of [%v, %v] in all (the call took %v)", tc.left, holds, tc.min-took, tc.max, took)
		}
	}
	if len(inv.seen) != 0 {
		t.Fatalf("%d attempts reached the down target, want none", len(inv.seen))
	}
}

func sum(ds []time.Duration) (total time.Duration) {
	for _, d := range ds {
		total += d
	}
	return total
}

// Hold < 0 turns the hold off: a refusal is at once.
func TestNoHold(t *testing.T) {
	i, _, inv := downTarget(t, -1, withHold(func(context.Context, time.Duration, <-chan struct{}) error {
		t.Error("held with Hold < 0")
		return nil
	}))
	if err := i.UnaryClient()(ctxTimeout(t, 10*time.Second), "/svc/M", nil, nil, newCC(t), inv.invoke); !errors.Is(err, adaptive.ErrThrottled) {
		t.Fatalf("got %v, want refused", err)
	}
}

// An aggregator calls pricing, which fails everything, and then
// inventory, a healthy service on the same target (one server, one
// address, one throttle). Once pricing's failures called the target
// down, its probes go to inventory too, and inventory's answer brings
// the target back. A user's trial: each probe went to pricing, the
// first to ask after the gap, and inventory was refused 40 of 40 times
// over 18 s.
func TestHealthyMethodProbesTarget(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set, err := adaptive.NewSet(adaptive.Config{Clock: clk, Rand: func() float64 { return 0.5 }, ProbeRatio: 1, Hold: -1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	i := mustNew(t, WithAdaptive(set), WithMaxAttempts(1), noWait)
	cc := newCC(t)
	pricing := &fakeInvoker{results: []error{errUnavailable}}
	inventory := &fakeInvoker{results: []error{nil}}
	call := func(method string, f *fakeInvoker) error {
		return i.UnaryClient()(ctxTimeout(t, 10*time.Second), method, nil, nil, cc, f.invoke)
	}
	for !set.Get("payment").Down() {
		if len(pricing.seen) > 10 {
			t.Fatal("setup: not down after 10 failures")
		}
		clk.Advance(30 * time.Millisecond)
		_ = call("/shop.Pricing/Get", pricing)
	}
	for round := 1; ; round++ {
		if round > 100 {
			t.Fatalf("inventory refused for 100 rounds (2 s): %d attempts of pricing, %d of inventory sent", len(pricing.seen), len(inventory.seen))
		}
		// Pricing asks first after each gap (50 ms: a probe every
		// ProbeInterval, every request having the credit).
		clk.Advance(15 * time.Millisecond)
		_ = call("/shop.Pricing/Get", pricing)
		clk.Advance(5 * time.Millisecond)
		if err := call("/shop.Inventory/Get", inventory); err == nil {
			t.Logf("inventory served again in round %d", round)
			break
		}
	}
	if set.Get("payment").Down() {
		t.Error("target still down after inventory's answer")
	}
}

// A held call asks again when the next probe may go, and goes as that
// probe: callers of a fixed number, all of whose requests are held, send
// nothing else, and without them no probe would go, nor would a failed
// one end their holds, until the holds end. A user's trial: 32 callers
// of an aggregator whose optional dependency was killed were held in
// step, 250 ms each, one probe per round (mean latency 245 ms against
// 19 ms with retries off).
func TestHeldCallProbes(t *testing.T) {
	var holds []time.Duration
	var clk *clock.Fake
	i, _, _, th, c := downTargetClock(t, time.Second, withHold(func(_ context.Context, d time.Duration, _ <-chan struct{}) error {
		holds = append(holds, d)
		clk.Advance(d) // the wait ran out
		return nil
	}))
	clk = c
	inv := &fakeInvoker{results: []error{errUnavailable}}
	err := i.UnaryClient()(ctxTimeout(t, 10*time.Second), "/svc/M", nil, nil, newCC(t), inv.invoke)
	if len(inv.seen) != 1 {
		t.Fatalf("attempts sent: %d (holds %v, %v), want 1: the probe", len(inv.seen), holds, err)
	}
	if want := []time.Duration{50 * time.Millisecond}; !slices.Equal(holds, want) {
		t.Errorf("holds %v, want %v (until the next probe may go)", holds, want)
	}
	if s := th.Stats(); s.Probes != 1 {
		t.Errorf("probes: %d, want 1", s.Probes)
	}
}

// A target revived by its connection alone while a call is held (a
// health trial makes every client's channel ready at once) does not send
// the call when the next probe would have been due: it waits for an
// answer, or the end of its hold, as before (a review: the callers held
// in one probe interval all went at the same instant, the herd that Back
// keeps them from).
func TestHeldCallWaitsForAnswerAfterRevival(t *testing.T) {
	var holds []time.Duration
	var th *adaptive.Throttle
	i, _, inv, thr, _ := downTargetClock(t, time.Second, withHold(func(_ context.Context, d time.Duration, _ <-chan struct{}) error {
		holds = append(holds, d)
		if len(holds) == 1 {
			th.Connectivity(false) // the channel broke, and is ready again
			th.Connectivity(true)
		}
		return nil
	}))
	th = thr
	if err := i.UnaryClient()(ctxTimeout(t, 10*time.Second), "/svc/M", nil, nil, newCC(t), inv.invoke); err != nil {
		t.Fatalf("call after its hold, target up: %v", err)
	}
	if want := []time.Duration{50 * time.Millisecond, 950 * time.Millisecond}; !slices.Equal(holds, want) {
		t.Errorf("holds %v, want %v: sent at the end of the hold, not when the probe was due", holds, want)
	}
	if len(inv.seen) != 1 {
		t.Errorf("attempts: %d, want 1", len(inv.seen))
	}
}

// WithoutHold, per call or for the interceptor, refuses a call to a down
// target at once, without the hold; the calls that do not say it are
// held as before (a user's trial: an optional branch of a fan-out, held
// for the next probe's answer, added 20-45 ms to every request of the
// aggregator while it failed everything).
func TestWithoutHold(t *testing.T) {
	for _, tc := range []struct {
		name           string
		atNew, perCall bool
	}{
		{name: "per call", perCall: true},
		{name: "at New", atNew: true},
		{name: "neither"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held := 0
			opts := []Option{withHold(func(context.Context, time.Duration, <-chan struct{}) error {
				held++
				return nil // the hold ran out: the target is still down
			})}
			if tc.atNew {
				opts = append(opts, WithoutHold())
			}
			i, _, inv := downTarget(t, 0, opts...)
			var callOpts []grpc.CallOption
			if tc.perCall {
				callOpts = append(callOpts, WithoutHold())
			}
			err := i.UnaryClient()(ctxTimeout(t, 10*time.Second), "/svc/M", nil, nil, newCC(t), inv.invoke, callOpts...)
			var se *Error
			if !errors.As(err, &se) || se.Reason != StopThrottled || len(inv.seen) != 0 {
				t.Fatalf("got %v after %d attempts, want refused by the throttle without an attempt", err, len(inv.seen))
			}
			if want := tc.atNew || tc.perCall; want != (held == 0) {
				t.Fatalf("held %d times, want held: %v", held, !want)
			}
		})
	}
}
