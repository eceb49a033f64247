package interceptor

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// recorder is an Observer that keeps the events.
type recorder struct {
	mu sync.Mutex
	ev []Event
}

func (r *recorder) Observe(_ context.Context, e Event) {
	r.mu.Lock()
	r.ev = append(r.ev, e)
	r.mu.Unlock()
}

func (r *recorder) count(k EventKind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.ev {
		if e.Kind == k {
			n++
		}
	}
	return n
}

func newAdaptive(t *testing.T, clk *clock.Fake, o Observer) *adaptive.Set {
	t.Helper()
	// No hold: the tests of the rules see each refusal at once (the hold
	// has its own tests).
	cfg := adaptive.Config{Clock: clk, Rand: func() float64 { return 0.5 }, Hold: -1}
	if o != nil {
		cfg.OnDown = AdaptiveObserver(o)
	}
	set, err := adaptive.NewSet(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// After healthy traffic, a dead target behind a ready (here idle)
// channel is down at the eighth failure in a row, 50 ms or more after its
// last accept; a quiet client retries only the first of them. The calls
// then fail at once, without reaching it, and say "do not retry"
// upstream; a probe's accept brings it back.
func TestAdaptiveOutageAndRecovery(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rec := &recorder{}
	set := newAdaptive(t, clk, nil) // New wires rec into the set
	var s sleeps
	i := mustNew(t, WithAdaptive(set), WithObserver(rec), s.option())
	cc := newCC(t)
	ok := &fakeInvoker{results: []error{nil}}
	for range 100 {
		if err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, ok.invoke); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Second)
	dead := &fakeInvoker{results: []error{errUnavailable}}
	err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, dead.invoke)
	if len(dead.seen) != 2 {
		t.Fatalf("attempts of the first call at a target silent for 1 s: got %d, want 2 (a lone failure is retried, not two in a row)", len(dead.seen))
	}
	th := set.Get(normalizeTarget(cc.Target()))
	for k := 2; k <= 7; k++ {
		if th.Down() {
			t.Fatalf("down after %d failures in a row behind a ready channel, want 8", len(dead.seen))
		}
		err = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, dead.invoke)
	}
	if len(dead.seen) != 8 || !th.Down() {
		t.Fatalf("after 7 calls: %d attempts, down %v; want 8 and down", len(dead.seen), th.Down())
	}
	if !errors.Is(err, adaptive.ErrThrottled) {
		t.Errorf("error: got %v, want it to wrap adaptive.ErrThrottled", err)
	}
	var se *Error
	if !errors.As(err, &se) || se.Reason != StopThrottled || status.Code(err) != codes.Unavailable {
		t.Errorf("error: got %v, want an *Error with StopThrottled and Unavailable", err)
	}
	if rec.count(EventTargetDown) != 1 {
		t.Errorf("EventTargetDown: got %d, want 1", rec.count(EventTargetDown))
	}
	// Down: calls fail without an attempt, until a probe is due (after
	// 20 requests at ProbeRatio 0.05, and 50 ms).
	ctx := &stateCtx{Context: ctxTimeout(t, time.Minute)}
	dead.seen = nil
	for range 19 {
		_ = i.UnaryClient()(ctx, "/svc/M", nil, nil, cc, dead.invoke)
	}
	if len(dead.seen) != 0 {
		t.Fatalf("attempts at a down target: got %d, want 0", len(dead.seen))
	}
	if !ctx.st.gaveUp.Load() {
		t.Error("a throttled call did not mark its request for a don't-retry answer")
	}
	if rec.count(EventThrottled) < 19 {
		t.Errorf("EventThrottled: got %d, want >= 19", rec.count(EventThrottled))
	}
	clk.Advance(50 * time.Millisecond)
	if err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, ok.invoke); err != nil {
		t.Fatalf("probe: %v", err)
	}
	if rec.count(EventProbe) != 1 || rec.count(EventTargetUp) != 1 {
		t.Errorf("probe and up events: got %d and %d, want 1 and 1", rec.count(EventProbe), rec.count(EventTargetUp))
	}
	// Back: every call goes out again, retries too.
	f := &fakeInvoker{results: []error{errUnavailable, nil}}
	if err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke); err != nil || len(f.seen) != 2 {
		t.Errorf("after recovery: err %v after %d attempts, want success on the retry", err, len(f.seen))
	}
	n := 0
	i.RangeThrottles(func(string, *adaptive.Throttle) bool { n++; return true })
	if n != 1 {
		t.Errorf("RangeThrottles: %d throttles, want 1", n)
	}
}

// A hang until the caller's deadline counts like UNAVAILABLE; a caller
// that cancels counts for nothing; a "do not retry" answer counts for
// nothing.
func TestAdaptiveHangsAndCancels(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline bool // the caller's deadline expires, else it cancels
		pushback bool
		wantDown bool
	}{
		{name: "deadline", deadline: true, wantDown: true},
		{name: "cancel"},
		{name: "pushback", pushback: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			set := newAdaptive(t, clk, nil)
			var s sleeps
			i := mustNew(t, WithAdaptive(set), s.option())
			cc := newCC(t)
			_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, (&fakeInvoker{results: []error{nil}}).invoke)
			clk.Advance(time.Second)
			// Eight such calls, 10 ms apart: the run of failures in a row
			// that marks a target behind a ready channel down (hangs
			// count once they have gone on for DownAfter, 50 ms).
			for range 8 {
				clk.Advance(10 * time.Millisecond)
				var ctx context.Context
				f := &fakeInvoker{results: []error{errUnavailable}, hang: !tc.pushback}
				switch {
				case tc.pushback:
					f.pushbacks = []string{"-1"}
					ctx = ctxTimeout(t, time.Minute)
				case tc.deadline:
					c, cancel := context.WithTimeout(context.Background(), time.Millisecond)
					t.Cleanup(cancel)
					ctx = c
				default:
					c, cancel := context.WithCancel(context.Background())
					cancel()
					ctx = c
				}
				_ = i.UnaryClient()(ctx, "/svc/M", nil, nil, cc, f.invoke)
			}
			if got := set.Get(normalizeTarget(cc.Target())).Down(); got != tc.wantDown {
				t.Errorf("down: got %v, want %v", got, tc.wantDown)
			}
		})
	}
}

// 30 % random failures never make the throttle refuse.
func TestAdaptiveSilentAtRandomFailures(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set := newAdaptive(t, clk, nil)
	var s sleeps
	i := mustNew(t, WithAdaptive(set), s.option(), WithMaxAttempts(2))
	cc := newCC(t)
	for n := range 1000 {
		res := []error{nil}
		if n%10 < 3 {
			res = []error{errUnavailable, nil}
		}
		f := &fakeInvoker{results: res}
		err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke)
		if err != nil {
			t.Fatalf("call %d: %v", n, err)
		}
		clk.Advance(time.Millisecond)
	}
	// The calls went through the throttle under test, not another key's.
	keys := 0
	i.RangeThrottles(func(target string, _ *adaptive.Throttle) bool {
		if target != normalizeTarget(cc.Target()) {
			t.Errorf("throttle for %q, want only %q", target, normalizeTarget(cc.Target()))
		}
		keys++
		return true
	})
	if keys != 1 {
		t.Fatalf("%d throttles, want 1", keys)
	}
	if s := set.Get(normalizeTarget(cc.Target())).Stats(); s.Shed+s.RetriesRefused+s.Refused != 0 {
		t.Errorf("refusals at 30 %% random failures: %+v", s)
	}
}

type fakeConn struct{ state connectivity.State }

// acceptedPayment returns a config with an adaptive set on a fake clock,
// and the throttle of "payment" that accepted an attempt a second ago.
func acceptedPayment(t *testing.T) (config, *adaptive.Throttle) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set := newAdaptive(t, clk, nil)
	cfg, err := newConfig([]Option{WithAdaptive(set)})
	if err != nil {
		t.Fatal(err)
	}
	th := set.Get("payment")
	p, _ := th.Allow(false)
	p.Done(adaptive.Accept)
	clk.Advance(time.Second)
	return cfg, th
}

func (f *fakeConn) GetState() connectivity.State { return f.state }

// A channel that broke while the target was down and is ready again lets
// the next call through without a probe.
func TestAdaptiveRevivedByReadyChannel(t *testing.T) {
	cfg, th := acceptedPayment(t)
	th.Connectivity(false) // a dead process: one failure marks it down
	p, _ := th.Allow(false)
	p.Done(adaptive.Overload)
	if !th.Down() {
		t.Fatal("not down")
	}
	conn := &fakeConn{state: connectivity.TransientFailure}
	newCall := func() *call {
		c := &call{}
		c.init(ctxTimeout(t, time.Minute), &cfg, "payment", "/svc/M")
		c.conn = conn
		return c
	}
	if err := newCall().begin(&attempt{}); !errors.Is(err, adaptive.ErrThrottled) {
		t.Fatalf("admit with the channel broken: got %v, want refused", err)
	}
	conn.state = connectivity.Ready
	var a attempt
	if err := newCall().begin(&a); err != nil {
		t.Fatalf("admit with the channel ready again: %v", err)
	}
	if th.Down() || a.thr.Probe() {
		t.Errorf("down %v, probe %v after the channel came back: want up, not a probe", th.Down(), a.thr.Probe())
	}
}

// Streams pass the same throttle: a down target refuses a stream without
// opening it, and a probe stream that completes brings the target back.
func TestAdaptiveStream(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set := newAdaptive(t, clk, nil)
	cc := newCC(t)
	th := set.Get(normalizeTarget(cc.Target()))
	p, _ := th.Allow(false)
	p.Done(adaptive.Accept)
	clk.Advance(time.Second)
	th.Connectivity(false) // a dead process: one failure marks it down
	p, _ = th.Allow(false)
	p.Done(adaptive.Overload)
	if !th.Down() {
		t.Fatal("not down")
	}
	i := mustNew(t, WithAdaptive(set))
	fs := &fakeStreamer{plans: []plan{{mode: "ok"}}}
	ctx := ctxTimeout(t, 10*time.Second)
	if _, err := i.StreamClient()(ctx, bidiDesc, cc, "/svc/Bidi", fs.streamer); !errors.Is(err, adaptive.ErrThrottled) {
		t.Fatalf("stream to a down target: got %v, want ErrThrottled", err)
	}
	if len(fs.attempts) != 0 {
		t.Fatalf("streams opened at a down target: %d, want 0", len(fs.attempts))
	}
	clk.Advance(50 * time.Millisecond)
	var cs grpc.ClientStream
	for n := 0; cs == nil && n < 30; n++ {
		cs, _ = i.StreamClient()(ctx, bidiDesc, cc, "/svc/Bidi", fs.streamer)
	}
	if cs == nil {
		t.Fatal("no probe stream in 30 tries")
	}
	if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"}); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); err != nil {
		t.Fatal(err)
	}
	_ = cs.CloseSend()
	if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); !errors.Is(err, io.EOF) {
		t.Fatalf("end: got %v, want io.EOF", err)
	}
	if th.Down() {
		t.Error("still down after a probe stream completed")
	}
}
