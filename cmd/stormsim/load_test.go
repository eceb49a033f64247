package main

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

func TestArrivalsSchedule(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		elapsed time.Duration
		rate    int
		want    int
	}{
		{-ms, 200, 0},
		{0, 200, 1},
		{5*ms - 1, 200, 1},
		{5 * ms, 200, 2},
		{time.Second - 1, 200, 200},
		{time.Second, 200, 201},
		{333 * ms, 3, 1}, // every 333.3 ms
		{334 * ms, 3, 2},
		{time.Hour, maxRate, 3600*maxRate + 1}, // no overflow
	} {
		if got := arrivalsBy(c.elapsed, c.rate); got != c.want {
			t.Errorf("arrivalsBy(%v, %d): got %d, want %d", c.elapsed, c.rate, got, c.want)
		}
	}
	for _, c := range []struct {
		total time.Duration
		rate  int
		want  int
	}{
		{2 * time.Second, 200, 400}, // at 0, 5 ms, ... 1995 ms
		{150 * ms, 40, 6},
		{time.Nanosecond, 1, 1},
		{time.Second, 1, 1},
		{time.Second + 1, 1, 2},
		{time.Hour, maxRate, 3600 * maxRate},
	} {
		if got := arrivalsWithin(c.total, c.rate); got != c.want {
			t.Errorf("arrivalsWithin(%v, %d): got %d, want %d", c.total, c.rate, got, c.want)
		}
	}
}

// heldClient answers a unary call only when release is closed, or fails
// it when its context ends; calls receives each call's context.
type heldClient struct {
	testsvcv1.TestServiceClient
	calls   chan context.Context
	release chan struct{}
}

func newHeldClient() *heldClient {
	return &heldClient{calls: make(chan context.Context, 64), release: make(chan struct{})}
}

func (c *heldClient) Unary(ctx context.Context, _ *testsvcv1.UnaryRequest, _ ...grpc.CallOption) (*testsvcv1.UnaryResponse, error) {
	c.calls <- ctx
	select {
	case <-c.release:
		return &testsvcv1.UnaryResponse{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// receive waits for n calls and checks that each has the request deadline.
func (c *heldClient) receive(t *testing.T, n int) {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for i := range n {
		select {
		case ctx := <-c.calls:
			if d, ok := ctx.Deadline(); !ok || time.Until(d) > requestTimeout {
				t.Errorf("a request with deadline %v (set: %v), want at most %v from now", d, ok, requestTimeout)
			}
		case <-timeout.C:
			t.Fatalf("%d of %d calls arrived", i, n)
		}
	}
}

// TestArrivalsOpenLoop: requests leave on the clock's schedule while none
// of them is answered (an open loop), exactly as many as the schedule
// says, and drain records each one once answered.
func TestArrivalsOpenLoop(t *testing.T) {
	cl := newHeldClient()
	clk := clock.NewFake(time.Unix(1000, 0))
	ticks := make(chan time.Time)
	rec := &recorder{}
	a := startArrivalsOn(cl, 200, 50*time.Millisecond, rec, clk, ticks)
	cl.receive(t, 1) // the first leaves at once
	clk.Advance(12 * time.Millisecond)
	ticks <- time.Time{}
	cl.receive(t, 2) // due at 5 and 10 ms, none answered yet
	clk.Advance(100 * time.Millisecond)
	ticks <- time.Time{} // late: the 7 it owes at once, and no more
	cl.receive(t, 7)
	select {
	case <-a.sent:
	case <-time.After(10 * time.Second):
		t.Fatal("sending did not end after the last request")
	}
	if n := rec.requests(); n != 0 {
		t.Fatalf("%d requests recorded before any answer, want 0", n)
	}
	close(cl.release)
	a.drain()
	if n, ok := rec.requests(), rec.ok.Load(); n != 10 || ok != 10 {
		t.Fatalf("after drain: %d requests recorded, %d ok; want 10, 10", n, ok)
	}
	if len(cl.calls) != 0 {
		t.Fatalf("%d calls beyond the 10 of the schedule", len(cl.calls))
	}
}

// TestArrivalsStop: stop ends the sending before its time and cancels the
// requests in flight, which are not recorded.
func TestArrivalsStop(t *testing.T) {
	cl := newHeldClient()
	ticks := make(chan time.Time)
	rec := &recorder{}
	a := startArrivalsOn(cl, 200, time.Hour, rec, clock.NewFake(time.Unix(1000, 0)), ticks)
	cl.receive(t, 1)
	a.stop()
	if n := rec.requests(); n != 0 {
		t.Fatalf("%d cancelled requests recorded, want 0", n)
	}
	select {
	case <-a.sent:
	default:
		t.Fatal("stop returned while sending goes on")
	}
}

// TestArrivalsRealClock: startArrivals on the real clock sends exactly its
// schedule's requests through a client that answers at once (its ticker's
// goroutine ends: goleak checks it at the end of the package's tests).
func TestArrivalsRealClock(t *testing.T) {
	cl := newHeldClient()
	close(cl.release)
	rec := &recorder{}
	a := startArrivals(cl, 1000, 30*time.Millisecond, rec)
	a.drain()
	if n := rec.requests(); n != 30 {
		t.Fatalf("%d requests, want 30", n)
	}
}
