package interceptor

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestServerDeadlineFiresFirst: an attempt with a per-attempt timeout
// whose server's deadline (the attempt's, sent in grpc-timeout) fires
// before the client's own timer ends with DeadlineExceeded while the
// attempt's context is still alive. It is the attempt's own timeout all
// the same, and is retried. The clock the interceptor reads an attempt's
// end from is set past the attempt's deadline, while the real timer (an
// hour) has not fired: the state the race leaves, made exact. Before the
// fix, the interceptor trusted only the attempt context's Err and made 1
// attempt; a loaded machine lost about one retry in four to this.
func TestServerDeadlineFiresFirst(t *testing.T) {
	deadlineExceeded := status.Error(codes.DeadlineExceeded, "server's deadline expired")
	later := func() time.Time { return time.Now().Add(2 * time.Hour) } // past every attempt's deadline
	for _, tt := range []struct {
		name   string
		caller time.Duration // the caller's deadline
		now    func() time.Time
		want   int
	}{
		// The attempt's deadline (1 h) comes before the caller's (10 h),
		// and has passed: the attempt's own timeout.
		{"after the attempt's own deadline", 10 * time.Hour, later, DefaultMaxAttempts},
		// The same answer before the attempt's deadline is the server's
		// own (a dependency of its timed out): not retried.
		{"before the attempt's deadline", 10 * time.Hour, time.Now, 1},
		// The caller's deadline (30 min) comes first, so the attempt's
		// deadline is the caller's, which is never retried, even while
		// the caller's context has not seen it yet.
		{"the attempt's deadline is the caller's", 30 * time.Minute, later, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var s sleeps
			f := &fakeInvoker{results: []error{deadlineExceeded}}
			i := mustNew(t, s.option(), withNow(tt.now), WithPerAttemptTimeout(time.Hour))
			err := i.UnaryClient()(ctxTimeout(t, tt.caller), "/svc/M", nil, nil, newCC(t), f.invoke)
			if got := len(f.seen); got != tt.want {
				t.Fatalf("attempts: got %d, want %d (last error %v)", got, tt.want, err)
			}
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("got %v, want DeadlineExceeded", err)
			}
		})
	}
}

// TestStreamDeadlineNeverRetried: streams have no per-attempt timeout,
// so a stream's DeadlineExceeded, from its server or its caller, is never
// retried, and the race of TestServerDeadlineFiresFirst cannot arise.
func TestStreamDeadlineNeverRetried(t *testing.T) {
	n := 0
	streamer := func(context.Context, *grpc.StreamDesc, *grpc.ClientConn, string, ...grpc.CallOption) (grpc.ClientStream, error) {
		n++
		return nil, status.Error(codes.DeadlineExceeded, "server's deadline expired")
	}
	desc := &grpc.StreamDesc{ServerStreams: true}
	i := mustNew(t, noWait, withNow(func() time.Time { return time.Now().Add(2 * time.Hour) }), WithPerAttemptTimeout(time.Hour))
	_, err := i.StreamClient()(ctxTimeout(t, 10*time.Hour), desc, newCC(t), "/svc/S", streamer)
	if status.Code(err) != codes.DeadlineExceeded || n != 1 {
		t.Fatalf("got %v after %d attempts, want DeadlineExceeded after 1", err, n)
	}
}
