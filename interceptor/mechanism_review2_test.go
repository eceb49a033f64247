package interceptor

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/budget"
)

// The regressions of the review of the mechanisms (2026-12-05), each
// failing on the code before its fix.

// panicOnEnd is an observer that panics on its first EventAttemptEnd.
type panicOnEnd struct{ once sync.Once }

func (p *panicOnEnd) Observe(_ context.Context, e Event) {
	if e.Kind == EventAttemptEnd {
		p.once.Do(func() { panic("observer end") })
	}
}

// The observer is the last mechanism, so report (last asked first) calls
// its done before the breaker's: a panic there must not skip the
// breaker's Done, or the half-open probe's slot is never released.
func TestMechanismObserverEndPanicReleasesProbe(t *testing.T) {
	set, _ := halfOpenSet(t)
	i := mustNew(t, WithBreaker(set), WithObserver(&panicOnEnd{}), noWait)
	cc := newCC(t)
	f := &fakeInvoker{results: []error{nil}}
	_, p := recovering(func() error {
		return i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke)
	})
	if !p {
		t.Fatal("setup: observer did not panic")
	}
	if err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke); err != nil {
		t.Fatalf("the call after the observer's panic: %v, want the probe slot released", err)
	}
}

// gRFC A6 / grpc-go: an attempt that failed with a retryable code, or any
// code with pushback -1, takes a token. A retried ABORTED was reported to
// the limiter as a success, so with WithCodes(Aborted) a target that
// answers ABORTED to everything kept the A6 throttle full and was retried
// on every call forever.
func TestLimiterThrottleRetriedAbortedIsFailure(t *testing.T) {
	i := mustNew(t, WithThrottle(budget.ThrottleConfig{}), WithCodes(codes.Aborted, codes.Unavailable), WithMaxAttempts(3), noWait)
	cc := newCC(t)
	var last int
	for range 20 {
		f := &fakeInvoker{results: []error{status.Error(codes.Aborted, "conflict")}}
		_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke)
		last = len(f.seen)
	}
	var tokens float64
	i.client.cfg.limiters.Range(func(_ string, l budget.Limiter) bool { tokens = l.Snapshot().Tokens; return true })
	if last != 1 {
		t.Errorf("20th call to a target failing ABORTED (retried): %d attempts, want 1 (A6 throttle engaged); tokens %v", last, tokens)
	}
}

// A pushback -1 on a code that is not retried (INTERNAL) is a failure for
// grpc-go's throttle; it refilled tokens.
func TestLimiterThrottleDontRetryIsNotSuccess(t *testing.T) {
	i := mustNew(t, WithThrottle(budget.ThrottleConfig{}), noWait)
	cc := newCC(t)
	for range 10 {
		f := &fakeInvoker{results: []error{errUnavailable}, pushbacks: []string{"", "", ""}}
		_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke)
	}
	var before, after float64
	i.client.cfg.limiters.Range(func(_ string, l budget.Limiter) bool { before = l.Snapshot().Tokens; return true })
	f := &fakeInvoker{results: []error{errInternal}, pushbacks: []string{"-1"}}
	_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke)
	i.client.cfg.limiters.Range(func(_ string, l budget.Limiter) bool { after = l.Snapshot().Tokens; return true })
	if after > before {
		t.Errorf("INTERNAL + pushback -1 raised the A6 tokens %v -> %v; grpc-go counts it as a failure", before, after)
	}
}

// panicLimiter's RecordOutcome panics once (a custom WithLimiter).
type panicLimiter struct {
	recLimiter
	once sync.Once
}

func (l *panicLimiter) RecordOutcome(bool) { l.once.Do(func() { panic("limiter") }) }

// The limiter is asked after the breaker, so it hears first: its panic
// must not skip the breaker's Done.
func TestMechanismLimiterPanicReleasesProbe(t *testing.T) {
	set, _ := halfOpenSet(t)
	l := &panicLimiter{}
	i := mustNew(t, WithBreaker(set), WithLimiter(func() budget.Limiter { return l }), noWait)
	cc := newCC(t)
	f := &fakeInvoker{results: []error{nil}}
	_, _ = recovering(func() error {
		return i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke)
	})
	if err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke); err != nil {
		t.Fatalf("the call after the limiter's panic: %v, want the probe slot released", err)
	}
}
