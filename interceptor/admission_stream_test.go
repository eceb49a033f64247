package interceptor

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// TestAdmissionStreamsHoldNoSlot (issue 14 review): long-lived streams do
// not hold admission slots. With a limit of 2, five streams open at once
// are all admitted and, while they stay open, unary calls still get the
// whole limit. When streams held their slots, the third stream was
// refused, and as many open streams as the limit refused every request
// for good (nothing measured was left to raise the limit).
func TestAdmissionStreamsHoldNoSlot(t *testing.T) {
	s := startAdmission(t, WithAdmission(fixedLimit(2)))
	c := s.client(t, grpc.WithDisableRetry())
	const streams = 5
	errs := make(chan error, streams)
	var wg sync.WaitGroup
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := c.ServerStream(ctx, &testsvcv1.ServerStreamRequest{})
			for err == nil {
				_, err = st.Recv()
			}
			errs <- err
		}()
	}
	t.Cleanup(func() { s.open(); wg.Wait() })
	for i := range streams {
		select {
		case <-s.entered:
		case err := <-errs:
			t.Fatalf("stream %d of %d at a limit of 2: ended with %v before its handler ran", i+1, streams, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("streams did not reach the handler")
		}
	}
	if got := s.i.Admission().InFlight(); got != 0 {
		t.Fatalf("in flight with %d streams open: got %d, want 0", streams, got)
	}
	s.hold(t, c, 2) // both admitted: the streams left the limit to unary calls
	_, err := c.Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "third"})
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("third unary call at a limit of 2: got %v, want Unavailable", err)
	}
}
