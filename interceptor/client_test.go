package interceptor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/clock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// seenAttempt is what the fake invoker saw of one attempt.
type seenAttempt struct {
	md          metadata.MD
	hasDeadline bool
	deadline    time.Duration // remaining at the attempt (may be below 0 on a slow machine)
}

// fakeInvoker answers attempt i with results[i] (the last one repeats)
// and, when pushbacks[i] is set, that pushback trailer.
type fakeInvoker struct {
	results   []error
	pushbacks []string
	seen      []seenAttempt
	// hang makes the attempts wait for their context to end.
	hang bool
}

func (f *fakeInvoker) invoke(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
	i := len(f.seen)
	md, _ := metadata.FromOutgoingContext(ctx)
	a := seenAttempt{md: md}
	if dl, ok := ctx.Deadline(); ok {
		a.hasDeadline, a.deadline = true, time.Until(dl)
	}
	f.seen = append(f.seen, a)
	if f.hang {
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	if i < len(f.pushbacks) && f.pushbacks[i] != "" {
		for _, o := range opts {
			if t, ok := o.(*grpc.TrailerCallOption); ok {
				*t.TrailerAddr = metadata.Pairs(MetadataPushback, f.pushbacks[i])
			}
		}
	}
	return f.results[min(i, len(f.results)-1)]
}

var (
	errUnavailable = status.Error(codes.Unavailable, "payment is down")
	errInternal    = status.Error(codes.Internal, "boom")
)

// cc is a ClientConn for the interceptor's target key; it never connects.
func newCC(t testing.TB) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///payment", grpc.WithTransportCredentials(insecureCreds()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func mustNew(t *testing.T, opts ...Option) *Interceptors {
	t.Helper()
	i, err := New(opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return i
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestRetriesUntilSuccess(t *testing.T) {
	var s sleeps
	f := &fakeInvoker{results: []error{errUnavailable, errUnavailable, nil}}
	i := mustNew(t, s.option(), withRand(func() float64 { return 0.5 }))
	err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	if err != nil {
		t.Fatalf("got %v, want success on the third attempt", err)
	}
	if got := len(f.seen); got != 3 {
		t.Fatalf("attempts: got %d, want 3", got)
	}
	// Full jitter with u = 0.5: half of 50 ms, then half of 100 ms.
	if got, want := fmt.Sprint(s.d), "[25ms 50ms]"; got != want {
		t.Fatalf("waits: got %s, want %s", got, want)
	}
}

func TestAttemptMetadata(t *testing.T) {
	f := &fakeInvoker{results: []error{errUnavailable}}
	var s sleeps
	i := mustNew(t, s.option())
	_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	var got []string
	for _, a := range f.seen {
		got = append(got, fmt.Sprintf("%v/%v/%v", a.md.Get(MetadataAttempt), a.md.Get(MetadataDepth), a.md.Get(MetadataUpstreamRetries)))
	}
	// Outside any handler: no depth, no upstream retries; the attempt
	// index from the first retry on, as go-grpc-middleware sends it.
	if want := "[[]/[]/[] [1]/[]/[] [2]/[]/[]]"; fmt.Sprint(got) != want {
		t.Fatalf("edge client metadata: got %v, want %v", got, want)
	}

	// Inside a handler at depth 1 whose caller is on its first retry.
	ctx := &stateCtx{Context: ctxTimeout(t, time.Minute)}
	ctx.st.info = Info{Depth: 1, Attempt: 1, UpstreamRetries: 1}
	f = &fakeInvoker{results: []error{errUnavailable}}
	_ = i.UnaryClient()(ctx, "/svc/M", nil, nil, newCC(t), f.invoke)
	if len(f.seen) != 1 {
		t.Fatalf("with upstream retries: %d attempts, want 1 (default tier policy)", len(f.seen))
	}
	md := f.seen[0].md
	if got := fmt.Sprintf("%v/%v/%v", md.Get(MetadataAttempt), md.Get(MetadataDepth), md.Get(MetadataUpstreamRetries)); got != "[]/[2]/[1]" {
		t.Fatalf("in-handler metadata: got %s, want []/[2]/[1]", got)
	}
	if !ctx.st.gaveUp.Load() {
		t.Fatal("tier policy stop did not mark the request for a don't-retry answer")
	}
}

func TestStopReasons(t *testing.T) {
	openSet, err := breaker.NewSet(breaker.Config{MinimumCalls: 1, Clock: clock.NewFake(time.Unix(0, 0))}, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Trip the breaker for the test target.
	p, _ := openSet.Get("payment").Allow()
	p.Done(breaker.Failure)

	tests := []struct {
		name      string
		opts      []Option
		results   []error
		pushbacks []string
		attempts  int
		code      codes.Code
		reason    StopReason // 0: the attempt's own error is returned
		is        error
	}{
		{name: "success", results: []error{nil}, attempts: 1, code: codes.OK},
		{name: "not retryable", results: []error{errInternal}, attempts: 1, code: codes.Internal},
		{name: "attempts used up", results: []error{errUnavailable}, attempts: 3, code: codes.Unavailable, reason: StopAttempts},
		{name: "max attempts 1", opts: []Option{WithMaxAttempts(1)}, results: []error{errUnavailable}, attempts: 1, code: codes.Unavailable, reason: StopAttempts},
		{name: "negative pushback", results: []error{errUnavailable}, pushbacks: []string{"-1"}, attempts: 1, code: codes.Unavailable, reason: StopPushback},
		{name: "malformed pushback", results: []error{errUnavailable}, pushbacks: []string{"soon"}, attempts: 1, code: codes.Unavailable, reason: StopPushback},
		{name: "retryable then non-retryable", results: []error{errUnavailable, errInternal}, attempts: 2, code: codes.Internal, reason: StopNotRetryable},
		{name: "custom codes", opts: []Option{WithCodes(codes.Internal)}, results: []error{errInternal}, attempts: 3, code: codes.Internal, reason: StopAttempts},
		// 0 retries < 0.2 x 1 request allows one retry; 1 < 0.2 refuses
		// the second.
		{name: "budget refuses", opts: []Option{WithBudget(budget.Config{NoFloor: true})}, results: []error{errUnavailable}, attempts: 2, code: codes.Unavailable, reason: StopBudget, is: budget.ErrRefused},
		{name: "breaker open", opts: []Option{WithBreaker(openSet)}, results: []error{nil}, attempts: 0, code: codes.Unavailable, reason: StopBreakerOpen, is: breaker.ErrOpen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s sleeps
			f := &fakeInvoker{results: tt.results, pushbacks: tt.pushbacks}
			i := mustNew(t, append([]Option{s.option()}, tt.opts...)...)
			err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
			if got := len(f.seen); got != tt.attempts {
				t.Errorf("attempts: got %d, want %d", got, tt.attempts)
			}
			if got := status.Code(err); got != tt.code {
				t.Errorf("code: got %v, want %v (%v)", got, tt.code, err)
			}
			var se *Error
			switch {
			case tt.reason == 0 && errors.As(err, &se):
				t.Errorf("got a stormguard error %v, want the attempt's own", err)
			case tt.reason != 0 && !errors.As(err, &se):
				t.Errorf("got %v, want a stormguard error with reason %v", err, tt.reason)
			case tt.reason != 0:
				if se.Reason != tt.reason || se.Attempts != tt.attempts {
					t.Errorf("got reason %v after %d attempts, want %v after %d", se.Reason, se.Attempts, tt.reason, tt.attempts)
				}
				if !strings.Contains(err.Error(), fmt.Sprintf("%d attempt(s)", tt.attempts)) {
					t.Errorf("message %q does not say how many attempts", err)
				}
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.is)
			}
			if tt.attempts > 0 && err != nil && !errors.Is(err, f.results[min(tt.attempts, len(f.results))-1]) {
				t.Errorf("error %v does not unwrap to the last attempt's error", err)
			}
		})
	}
}

// TestBreakerMessageHidesTarget: the status of a call an open breaker
// refused carries a fixed message, never the target (an internal address
// that a server passing the error up would send to its caller); neither
// does the Go error string.
func TestBreakerMessageHidesTarget(t *testing.T) {
	set, _ := breaker.NewSet(breaker.Config{MinimumCalls: 1, Clock: clock.NewFake(time.Unix(0, 0))}, 0)
	p, _ := set.Get("payment").Allow() // the key of "passthrough:///payment"
	p.Done(breaker.Failure)
	f := &fakeInvoker{results: []error{nil}}
	err := mustNew(t, WithBreaker(set)).UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	if got := status.Convert(err).Message(); got != BreakerOpenMessage {
		t.Fatalf("status message %q, want %q", got, BreakerOpenMessage)
	}
	if strings.Contains(err.Error(), "payment") {
		t.Fatalf("error %q names the target", err)
	}
}

func TestPushbackHonoured(t *testing.T) {
	tests := []struct {
		pushback string
		want     time.Duration
	}{
		{"0", 0},
		{"200", 200 * time.Millisecond},
		{"999999999", time.Second},           // bounded by the backoff cap
		{"9223372036854775807", time.Second}, // no overflow into a negative wait
	}
	for _, tt := range tests {
		t.Run(tt.pushback, func(t *testing.T) {
			var s sleeps
			f := &fakeInvoker{results: []error{errUnavailable, nil}, pushbacks: []string{tt.pushback}}
			err := mustNew(t, s.option()).UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
			if err != nil {
				t.Fatalf("got %v, want success on the retry", err)
			}
			if len(s.d) != 1 || s.d[0] != tt.want {
				t.Fatalf("waits: got %v, want [%v]", s.d, tt.want)
			}
		})
	}
}

func TestDeadlineGivesUpWithoutSleeping(t *testing.T) {
	var s sleeps
	f := &fakeInvoker{results: []error{errUnavailable}}
	// Base and cap an hour, u just under 1: the next wait is about an
	// hour, far beyond the caller's minute, which cannot pass before the
	// first attempt returns (a 50 ms deadline once did, under -race).
	i := mustNew(t, s.option(), WithBackoff(Backoff{Base: time.Hour, Cap: time.Hour}), withRand(func() float64 { return 0.99999 }))
	err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	var se *Error
	if !errors.As(err, &se) || se.Reason != StopDeadline {
		t.Fatalf("got %v, want a stop for the deadline", err)
	}
	if len(s.d) != 0 || len(f.seen) != 1 {
		t.Fatalf("slept %v and made %d attempts, want no sleep and 1 attempt", s.d, len(f.seen))
	}
}

func TestCallerCancelledNeverRetries(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakeInvoker{results: []error{errUnavailable}}
	var s sleeps
	inv := func(c context.Context, m string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		cancel() // the caller gives up while the attempt is in flight
		return f.invoke(c, m, req, reply, cc, opts...)
	}
	err := mustNew(t, s.option()).UnaryClient()(ctx, "/svc/M", nil, nil, newCC(t), inv)
	if len(f.seen) != 1 || len(s.d) != 0 {
		t.Fatalf("%d attempts, waits %v: want 1 attempt and no wait", len(f.seen), s.d)
	}
	if !errors.Is(err, errUnavailable) {
		t.Fatalf("got %v, want the attempt's error", err)
	}
}

func TestPerAttemptTimeout(t *testing.T) {
	var s sleeps
	f := &fakeInvoker{hang: true}
	i := mustNew(t, s.option(), WithPerAttemptTimeout(time.Millisecond))
	err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	if got := len(f.seen); got != 3 {
		t.Fatalf("attempts: got %d, want 3 (DeadlineExceeded of an attempt is retried)", got)
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	for n, a := range f.seen {
		// The caller allows a minute: a deadline at most 1 ms away is the
		// attempt's own (it may have passed already on a slow machine).
		if !a.hasDeadline || a.deadline > time.Millisecond {
			t.Fatalf("attempt %d had %v left, want at most the per-attempt 1ms", n, a.deadline)
		}
	}

	// Without a per-attempt timeout DeadlineExceeded is never retried,
	// even when listed.
	if _, err := New(WithCodes(codes.DeadlineExceeded)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("WithCodes(DeadlineExceeded): got %v, want ErrInvalidOption", err)
	}
	f = &fakeInvoker{results: []error{status.Error(codes.DeadlineExceeded, "slow")}}
	_ = mustNew(t, s.option()).UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	if len(f.seen) != 1 {
		t.Fatalf("DeadlineExceeded without per-attempt timeout: %d attempts, want 1", len(f.seen))
	}
}

func TestPerCallOptions(t *testing.T) {
	var s sleeps
	i := mustNew(t, s.option())
	f := &fakeInvoker{results: []error{errUnavailable}}
	_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke, WithMaxAttempts(5))
	if len(f.seen) != 5 {
		t.Fatalf("per-call WithMaxAttempts(5): %d attempts", len(f.seen))
	}
	f = &fakeInvoker{results: []error{errUnavailable}}
	_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	if len(f.seen) != 3 {
		t.Fatalf("after a per-call option the default must stand: %d attempts, want 3", len(f.seen))
	}
	err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke, WithMaxAttempts(0))
	// A mistake of the calling code, not of the request: Internal.
	if status.Code(err) != codes.Internal {
		t.Fatalf("invalid per-call option: got %v, want Internal", err)
	}
}

func TestInvalidOptions(t *testing.T) {
	tests := []struct {
		name string
		opt  Option
	}{
		{"max attempts 0", WithMaxAttempts(0)},
		{"max attempts huge", WithMaxAttempts(1 << 20)},
		{"code OK", WithCodes(codes.OK)},
		{"code out of range", WithCodes(codes.Code(99))},
		{"negative base", WithBackoff(Backoff{Base: -1})},
		{"cap below base", WithBackoff(Backoff{Base: time.Second, Cap: time.Millisecond})},
		{"unknown jitter", WithBackoff(Backoff{Jitter: 7})},
		{"negative per-attempt timeout", WithPerAttemptTimeout(-time.Second)},
		{"bad budget", WithBudget(budget.Config{Ratio: 2})},
		{"bad throttle", WithThrottle(budget.ThrottleConfig{MaxTokens: -1})},
		{"nil limiter", WithLimiter(nil)},
		{"nil policy", WithTierPolicy(nil)},
		{"bad policy config", WithTierPolicyConfig(TierPolicyConfig{AttemptsByDepth: []int{0}})},
		{"typed nil limiter", WithLimiter(func() budget.Limiter { return (*budget.Budget)(nil) })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opt)
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("New: got %v, want ErrInvalidOption", err)
			}
			// The message names the option, once prefixed.
			if m := err.Error(); !strings.Contains(m, "With") || strings.Count(m, "stormguard:") != 1 {
				t.Errorf("New: %q, want the option named and one prefix", m)
			}
			// The convenience constructors fail calls instead.
			f := &fakeInvoker{results: []error{nil}}
			err = UnaryClientInterceptor(tt.opt)(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
			if status.Code(err) != codes.Internal || len(f.seen) != 0 {
				t.Fatalf("interceptor with invalid option: got %v after %d attempts, want Internal and none", err, len(f.seen))
			}
		})
	}
}

func TestBudgetLimitsRetriesPerTarget(t *testing.T) {
	var s sleeps
	fc := clock.NewFake(time.Unix(0, 0))
	// No floor, ratio 0.5: one retry per two requests.
	i := mustNew(t, s.option(), WithBudget(budget.Config{Ratio: 0.5, NoFloor: true, Clock: fc}))
	f := &fakeInvoker{results: []error{errUnavailable}}
	for range 10 {
		_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	}
	// 10 first attempts allow 5 retries.
	if got := len(f.seen); got != 15 {
		t.Fatalf("attempts: got %d, want 15 (10 requests + 5 retries)", got)
	}
}

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Cap: time.Second}
	tests := []struct {
		jitter Jitter
		retry  int
		u      float64
		prev   time.Duration
		want   time.Duration
	}{
		{FullJitter, 0, 0, 0, 0},
		{FullJitter, 0, 0.5, 0, 50 * time.Millisecond},
		{FullJitter, 2, 0.5, 0, 200 * time.Millisecond},
		{FullJitter, 10, 0.5, 0, 500 * time.Millisecond}, // capped at 1 s
		{FullJitter, 1 << 30, 0.5, 0, 500 * time.Millisecond},
		{FullJitter, -3, 0.5, 0, 50 * time.Millisecond},
		{FullJitter, 0, -1, 0, 0},                        // clamped
		{EqualJitter, 0, 0, 0, 50 * time.Millisecond},    // never below half
		{EqualJitter, 1, 0.5, 0, 150 * time.Millisecond}, // 100 + 50
		{DecorrelatedJitter, 0, 0, 0, 100 * time.Millisecond},
		{DecorrelatedJitter, 0, 0.5, 200 * time.Millisecond, 350 * time.Millisecond}, // 100 + 0.5*(600-100)
		{DecorrelatedJitter, 0, 0.9, 10 * time.Second, time.Second},                  // capped
	}
	for _, tt := range tests {
		b.Jitter = tt.jitter
		if got := b.Delay(tt.retry, tt.u, tt.prev); got != tt.want {
			t.Errorf("%v Delay(%d, %v, %v) = %v, want %v", tt.jitter, tt.retry, tt.u, tt.prev, got, tt.want)
		}
	}
	if got := (Backoff{}).Delay(0, 0.5, 0); got != DefaultBackoffBase/2 {
		t.Errorf("zero Backoff: got %v, want %v", got, DefaultBackoffBase/2)
	}
}
