package interceptor

import (
	"context"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The regressions of the review of the unary retry loop (2026-12-05),
// each failing on the code before its fix.

// Backoff.Delay's result is in [0, Cap], also for a cap of
// math.MaxInt64 ("no cap"), where float64(Cap) rounds up to 2^63, which
// no Duration holds (it overflowed to a negative wait).
func TestBackoffDelayWithinCapAtLargestDuration(t *testing.T) {
	for _, tt := range []struct {
		name string
		b    Backoff
		n    int
		u    float64
		prev time.Duration
	}{
		{"decorrelated, base=cap=MaxInt64", Backoff{Base: math.MaxInt64, Cap: math.MaxInt64, Jitter: DecorrelatedJitter}, 0, 0.5, 0},
		{"decorrelated, cap MaxInt64, prev large", Backoff{Cap: math.MaxInt64, Jitter: DecorrelatedJitter}, 30, 0.9, 1 << 62},
		{"equal, u clamped from 1", Backoff{Base: math.MaxInt64, Cap: math.MaxInt64, Jitter: EqualJitter}, 0, 1, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(WithBackoff(tt.b)); err != nil {
				t.Fatalf("WithBackoff refused it: %v", err)
			}
			if d := tt.b.Delay(tt.n, tt.u, tt.prev); d < 0 || d > tt.b.Cap {
				t.Fatalf("Delay = %v, want within [0, %v]", d, tt.b.Cap)
			}
		})
	}
}

// A negative wait read as "the call is over" with a nil error: a call
// whose every attempt failed returned nil (success) to its caller.
func TestHugeBackoffFailsTheCall(t *testing.T) {
	f := &fakeInvoker{results: []error{errUnavailable}}
	i := mustNew(t, noWait, WithBackoff(Backoff{Base: math.MaxInt64, Cap: math.MaxInt64, Jitter: DecorrelatedJitter}))
	err := i.UnaryClient()(context.Background(), "/svc/M", nil, nil, newCC(t), f.invoke)
	if err == nil {
		t.Fatalf("failed call returned nil after %d attempt(s); want UNAVAILABLE", len(f.seen))
	}
}

// The same with the default base and "no cap": decorrelated jitter grows
// the wait about 2.7x per retry until it passed 2^63 ns.
func TestNoCapDecorrelatedFailsTheCall(t *testing.T) {
	f := &fakeInvoker{results: []error{errUnavailable}}
	i := mustNew(t, noWait, withRand(func() float64 { return 0.9 }), WithMaxAttempts(MaxAttempts),
		WithBackoff(Backoff{Cap: math.MaxInt64, Jitter: DecorrelatedJitter}))
	err := i.UnaryClient()(context.Background(), "/svc/M", nil, nil, newCC(t), f.invoke)
	if err == nil {
		t.Fatalf("failed call returned nil after %d attempt(s); want UNAVAILABLE", len(f.seen))
	}
}

// Protocol section 4: a pushback value is valid after trimming spaces
// and tabs only; anything else is malformed: do not retry (U+00A0 and
// U+0085, which HTTP/2 allows in a header value, were trimmed).
func TestPushbackOtherSpaceIsMalformed(t *testing.T) {
	for _, v := range []string{"250\u00a0", "\u0085250"} {
		ms, ok := pushback(metadata.MD{MetadataPushback: {v}})
		if !ok || ms >= 0 {
			t.Errorf("pushback(%q) = %d, %v; want do not retry (-1, true)", v, ms, ok)
		}
	}
	// End to end: the call retries after that "do not retry".
	n := 0
	inv := func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
		n++
		for _, o := range opts {
			if tr, ok := o.(*grpc.TrailerCallOption); ok {
				*tr.TrailerAddr = metadata.MD{MetadataPushback: {"250\u00a0"}}
			}
		}
		return status.Error(codes.Unavailable, "down")
	}
	i := mustNew(t, noWait)
	_ = i.UnaryClient()(context.Background(), "/svc/M", nil, nil, newCC(t), inv)
	if n != 1 {
		t.Errorf("attempts = %d after a malformed pushback, want 1", n)
	}
}

// Protocol section 4: "+9223372036854775807" and leading zeros are valid
// (sign, digits, fits int64): a retry after the cap, or after 250 ms.
func TestPushbackLongValidValues(t *testing.T) {
	for _, v := range []string{"+9223372036854775807", "00000000000000000000250"} {
		if ms, ok := pushback(metadata.MD{MetadataPushback: {v}}); !ok || ms < 0 {
			t.Errorf("pushback(%q) = %d, %v; want a retry (protocol 4, valid)", v, ms, ok)
		}
	}
}
