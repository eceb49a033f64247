package interceptor

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/clock"
)

// TestPerCallMisuseIsInternal: a per-call option that is invalid, or that
// does not apply to a call, fails the call with Internal and a message
// that names the option, before any attempt; none is ignored silently.
func TestPerCallMisuseIsInternal(t *testing.T) {
	set, err := breaker.NewSet(breaker.Config{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		opt  Option
		name string // in the message
	}{
		{WithMaxAttempts(0), "WithMaxAttempts(0)"},
		{WithCodes(), "WithCodes()"},
		{WithBudget(budget.Config{}), "WithBudget"},
		{WithThrottle(budget.ThrottleConfig{}), "WithThrottle"},
		{WithLimiter(func() budget.Limiter { return nil }), "WithLimiter"},
		{WithBreaker(set), "WithBreaker"},
		{WithObserver(nil), "WithObserver"},
		{WithPerMethodKeys(), "WithPerMethodKeys"},
		{WithUntrustedCallers(), "WithUntrustedCallers"},
		{WithCodes(codes.Unavailable, codes.DeadlineExceeded), "WithPerAttemptTimeout"},
		{WithAdaptive(nil), "WithAdaptive"},
		{WithAdmission(admission.Config{}), "WithAdmission"},
		{WithEnvoyAttemptCount(false), "WithEnvoyAttemptCount"},
	}
	i := mustNew(t, noWait)
	for _, tt := range tests {
		f := &fakeInvoker{results: []error{nil}}
		err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke, tt.opt)
		if status.Code(err) != codes.Internal || !strings.Contains(status.Convert(err).Message(), tt.name) {
			t.Errorf("per-call %s: got %v, want Internal naming %s", tt.name, err, tt.name)
		}
		if len(f.seen) != 0 {
			t.Errorf("per-call %s: %d attempts, want none", tt.name, len(f.seen))
		}
	}
	// Per call, the options that apply still work, in any order.
	f := &fakeInvoker{results: []error{status.Error(codes.DeadlineExceeded, "slow")}}
	err = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke,
		WithCodes(codes.Unavailable, codes.DeadlineExceeded), WithPerAttemptTimeout(time.Hour), WithMaxAttempts(2))
	if status.Code(err) != codes.DeadlineExceeded || len(f.seen) != 1 {
		// A server's DeadlineExceeded is not the attempt's own timeout:
		// one attempt.
		t.Errorf("valid per-call options: got %v after %d attempts, want DeadlineExceeded after 1", err, len(f.seen))
	}
}

// TestOptionConflicts: options that contradict each other, or that would
// do nothing, are refused by New with a message that says what to write.
func TestOptionConflicts(t *testing.T) {
	tests := []struct {
		name string
		opts []Option
		want string
	}{
		{"budget and throttle", []Option{WithBudget(budget.Config{}), WithThrottle(budget.ThrottleConfig{})}, "WithBudget and WithThrottle: one retry limiter"},
		{"Recommended and a throttle", append(Recommended(), WithThrottle(budget.ThrottleConfig{})), "write its options out"},
		{"no codes", []Option{WithCodes()}, "WithMaxAttempts(1)"},
		{"canceled", []Option{WithCodes(codes.Unavailable, codes.Canceled)}, "codes.Canceled cannot be retried"},
		{"ok", []Option{WithCodes(codes.OK)}, "codes.OK"},
		{"unknown code", []Option{WithCodes(codes.Code(17))}, "unknown code 17"},
		{"deadline without per-attempt timeout", []Option{WithCodes(codes.Unavailable, codes.DeadlineExceeded)}, "add WithPerAttemptTimeout(d), or drop codes.DeadlineExceeded"},
		{"too many attempts", []Option{WithMaxAttempts(MaxAttempts + 1)}, fmt.Sprintf("want 1 to %d", MaxAttempts)},
	}
	for _, tt := range tests {
		_, err := New(tt.opts...)
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want ErrInvalidOption saying %q", tt.name, err, tt.want)
		}
	}
	// Accepted: DeadlineExceeded with a per-attempt timeout, in either
	// order, and the most attempts.
	for _, opts := range [][]Option{
		{WithCodes(codes.Unavailable, codes.DeadlineExceeded), WithPerAttemptTimeout(time.Second)},
		{WithPerAttemptTimeout(time.Second), WithCodes(codes.DeadlineExceeded)},
		{WithMaxAttempts(MaxAttempts)},
	} {
		if _, err := New(opts...); err != nil {
			t.Errorf("got %v, want no error", err)
		}
	}
}

// TestCodesDeadlineExceededRetriesTimeouts: WithCodes(DeadlineExceeded)
// with a per-attempt timeout retries the attempts whose own timeout
// expired, and does not add DeadlineExceeded to the codes a server
// answers "do not retry" with.
func TestCodesDeadlineExceededRetriesTimeouts(t *testing.T) {
	f := &fakeInvoker{hang: true}
	i := mustNew(t, noWait, WithCodes(codes.Unavailable, codes.DeadlineExceeded), WithPerAttemptTimeout(time.Millisecond))
	err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	if status.Code(err) != codes.DeadlineExceeded || len(f.seen) != DefaultMaxAttempts {
		t.Fatalf("got %v after %d attempts, want DeadlineExceeded after %d", err, len(f.seen), DefaultMaxAttempts)
	}
	if i.server.retryable != codeBit(codes.Unavailable) {
		t.Fatalf("server's codes: got %b, want Unavailable only", i.server.retryable)
	}
}

// An option given again replaces the earlier, the retry budget too: a
// WithBudget appended to Recommended() changes its budget, as WithAdmission
// and WithAdaptive change theirs (a new-user trial found the budget alone
// refused as a second limiter).
func TestBudgetGivenAgainReplaces(t *testing.T) {
	var s sleeps
	fc := clock.NewFake(time.Unix(0, 0))
	i := mustNew(t, s.option(),
		WithBudget(budget.Config{Ratio: 0.5, NoFloor: true, Clock: fc}),
		WithBudget(budget.Config{Ratio: 0.2, NoFloor: true, Clock: fc}))
	f := &fakeInvoker{results: []error{errUnavailable}}
	for range 10 {
		_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	}
	if got := len(f.seen); got != 12 {
		t.Fatalf("attempts: got %d, want 12 (10 requests + 2 retries: the second budget's 20 %%)", got)
	}
	if _, err := New(append(Recommended(), WithBudget(budget.Config{Ratio: 0.3}))...); err != nil {
		t.Fatalf("Recommended() with its budget changed: %v", err)
	}
}
