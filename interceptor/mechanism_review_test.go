package interceptor

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Review of fc26227 (the outcome table and the mechanism interface): each
// test failed on that commit, kept its parent's behaviour, and passes now,
// except TestMechanismRetryOrder, which pins the one order that changed on
// purpose.

// recLimiter is a budget.Limiter that records the outcomes it hears.
type recLimiter struct {
	mu       sync.Mutex
	outcomes []bool
}

func (l *recLimiter) RecordRequest()            {}
func (l *recLimiter) TryRetry() bool            { return true }
func (l *recLimiter) Snapshot() budget.Snapshot { return budget.Snapshot{} }
func (l *recLimiter) RecordOutcome(success bool) {
	l.mu.Lock()
	l.outcomes = append(l.outcomes, success)
	l.mu.Unlock()
}

func (l *recLimiter) got() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]bool(nil), l.outcomes...)
}

// An overload code that the client does not retry (UNAVAILABLE, with
// WithCodes naming others), with "do not retry", is an overload: before
// the refactor the breaker counted it as a failure and the budget as a
// failed attempt. The refactor's classify made every "do not retry" on a
// code that is not retried an answer (success), so a target that shed
// so never opened the breaker and earned retry budget. (The review's
// case was RESOURCE_EXHAUSTED, an answer since: a quota, not overload.)
func TestReviewOverloadDontRetryNotRetriedIsFailure(t *testing.T) {
	set := mustSet(t, breaker.Config{MinimumCalls: 1})
	lim := &recLimiter{}
	i := mustNew(t, WithBreaker(set), WithLimiter(func() budget.Limiter { return lim }), WithCodes(codes.Aborted), noWait)
	f := &fakeInvoker{results: []error{status.Error(codes.Unavailable, "full")}, pushbacks: []string{"-1"}}
	_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	if st := set.Get("payment").State(); st != breaker.Open {
		t.Errorf("breaker after UNAVAILABLE (not retried) + pushback -1 with MinimumCalls 1: %v, want open (a failure, as before fc26227)", st)
	}
	if got := lim.got(); len(got) != 1 || got[0] {
		t.Errorf("budget outcomes: %v, want [false] (a failure, as before fc26227)", got)
	}
}

// A half-open probe answered "do not retry" was Ignored by the breaker
// whatever its code (the answer comes from a live target whose dependency
// failed). After the refactor, on a code that is not retried (INTERNAL:
// e.g. a recovered panic of a handler whose call gave up) it is a Success
// and closes the breaker.
func TestReviewProbeDontRetryNotRetriedIgnored(t *testing.T) {
	set, b := halfOpenSet(t)
	i := mustNew(t, WithBreaker(set), noWait)
	f := &fakeInvoker{results: []error{errInternal}, pushbacks: []string{"-1"}}
	_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	if len(f.seen) != 1 {
		t.Fatalf("attempts: %d, want the one probe", len(f.seen))
	}
	if st := b.State(); st != breaker.HalfOpen {
		t.Errorf("breaker after a probe answered INTERNAL + pushback -1: %v, want still half-open (Ignored, as before fc26227)", st)
	}
}

// The mechanisms are asked whether a call may retry in the order they are
// asked whether an attempt may go out: the throttle first. With an open
// breaker and a throttle that refuses the retry, the call stops with
// StopThrottled (before fc26227, the breaker was asked first).
func TestMechanismRetryOrder(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cc := newCC(t)
	aset := newAdaptive(t, clk, nil)
	th := aset.Get(normalizeTarget(cc.Target()))
	for range 8 { // a failing run: no retry, not down (no time has passed)
		p, _ := th.Allow(false)
		p.Done(adaptive.Overload)
	}
	if th.Down() || th.RetryAllowed() {
		t.Fatalf("setup: down %v, retry allowed %v", th.Down(), th.RetryAllowed())
	}
	bset := mustSet(t, breaker.Config{MinimumCalls: 1})
	i := mustNew(t, WithAdaptive(aset), WithBreaker(bset), noWait)
	f := &fakeInvoker{results: []error{errUnavailable}}
	err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v, want an *Error", err)
	}
	if e.Reason != StopThrottled || !errors.Is(err, adaptive.ErrThrottled) {
		t.Errorf("stop reason: %v (%v), want %v, the throttle being asked first", e.Reason, err, StopThrottled)
	}
}

// An attempt whose invoker panics has no outcome: before the refactor the
// observer saw its start and no end. After it, the observer hears an
// EventAttemptEnd with codes.OK, which reads as a success.
func TestReviewPanicNotObservedAsOK(t *testing.T) {
	rec := &recorder{}
	i := mustNew(t, WithObserver(rec), noWait)
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		panic("codec")
	}
	func() {
		defer func() { _ = recover() }()
		_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), invoker)
	}()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, e := range rec.ev {
		if e.Kind == EventAttemptEnd && e.Code == codes.OK {
			t.Errorf("a panicking attempt was observed as ending with OK: %+v", e)
		}
	}
}

// panicOnStart is an observer that panics on its first EventAttemptStart.
type panicOnStart struct{ once sync.Once }

func (p *panicOnStart) Observe(_ context.Context, e Event) {
	if e.Kind == EventAttemptStart {
		p.once.Do(func() { panic("observer") })
	}
}

// A panic while the attempt starts (here the observer's EventAttemptStart)
// released the breaker permit before the refactor (the deferred Done was
// in place before attemptContext). After it, begin has no such defer: the
// half-open probe's slot is held forever and the breaker refuses every
// later call.
func TestReviewPanicAtAttemptStartReleasesProbe(t *testing.T) {
	set, _ := halfOpenSet(t)
	i := mustNew(t, WithBreaker(set), WithObserver(&panicOnStart{}), noWait)
	cc := newCC(t)
	f := &fakeInvoker{results: []error{nil}}
	func() {
		defer func() { _ = recover() }()
		_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke)
	}()
	if err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke); err != nil {
		t.Fatalf("the call after the panic: %v, want the probe to go out (its slot released)", err)
	}
}

// headerThenHang is a stream whose headers arrived and that then sends
// nothing: RecvMsg returns only after its context ended (a little late,
// as a real transport may be).
type headerThenHang struct {
	ctx context.Context
}

func (h *headerThenHang) Header() (metadata.MD, error) { return metadata.Pairs("k", "v"), nil }
func (h *headerThenHang) Trailer() metadata.MD         { return nil }
func (h *headerThenHang) CloseSend() error             { return nil }
func (h *headerThenHang) Context() context.Context     { return h.ctx }
func (h *headerThenHang) SendMsg(any) error            { return nil }
func (h *headerThenHang) RecvMsg(any) error {
	<-h.ctx.Done()
	time.Sleep(50 * time.Millisecond)
	return status.FromContextError(h.ctx.Err()).Err()
}

// A stream whose target answered (its headers arrived) and that then ran
// into the caller's deadline counts for nothing (docs/protocol.md 4.3).
// Before the refactor the budget and the throttle heard the attempt from
// RecvMsg, which first sees the headers: nothing. After it, abandoned
// (context.AfterFunc) reports to every mechanism at the deadline, before
// RecvMsg looked at the headers, and the budget (and the adaptive
// throttle) hear a hang.
func TestReviewAnsweredStreamDeadlineNotAHang(t *testing.T) {
	lim := &recLimiter{}
	i := mustNew(t, WithLimiter(func() budget.Limiter { return lim }), noWait)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		return &headerThenHang{ctx: ctx}, nil
	}
	cs, err := i.StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", streamer)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"}); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("RecvMsg: %v, want DeadlineExceeded", err)
	}
	for _, ok := range lim.got() {
		if !ok {
			t.Errorf("budget heard a failure (hang) for a stream whose headers had arrived: %v", lim.got())
		}
	}
}
