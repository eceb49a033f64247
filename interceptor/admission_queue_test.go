package interceptor

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/internal/clock"
)

// queueClock is a fake clock with timers (admission.Timers): armed
// receives one value per timer started; Advance fires the due ones.
type queueClock struct {
	*clock.Fake
	armed  chan struct{}
	mu     sync.Mutex
	timers []*queueTimer
}

type queueTimer struct {
	at   time.Time
	f    func()
	done bool
}

func (c *queueClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	t := &queueTimer{at: c.Now().Add(d), f: f}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	c.armed <- struct{}{}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		stopped := !t.done
		t.done = true
		return stopped
	}
}

func (c *queueClock) Advance(d time.Duration) {
	c.Fake.Advance(d)
	var due []*queueTimer
	c.mu.Lock()
	for _, t := range c.timers {
		if !t.done && !t.at.After(c.Now()) {
			t.done = true
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
}

// queued is a server interceptor with a limit of 1 and a queue, its slot
// taken, and a unary call started that waits in the queue.
type queued struct {
	i      *Interceptors
	clk    *queueClock
	held   admission.Permit
	events chan Event
	ran    chan struct{}
	result chan error
}

func startQueued(t *testing.T, ctx context.Context) *queued {
	t.Helper()
	q := &queued{
		clk:    &queueClock{Fake: clock.NewFake(time.Now()), armed: make(chan struct{}, 4)},
		events: make(chan Event, 4),
		ran:    make(chan struct{}, 1),
		result: make(chan error, 1),
	}
	cfg := admission.Config{MaxInFlight: 1, QueueSize: 4, QueueTimeout: 100 * time.Millisecond, Clock: q.clk}
	q.i = mustNew(t, WithAdmission(cfg), WithObserver(observerFunc(func(_ context.Context, e Event) {
		if e.Kind == EventAdmissionRefused {
			q.events <- e
		}
	})))
	var err error
	if q.held, err = q.i.Admission().Acquire(admission.ClassFirst, time.Time{}); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := q.i.UnaryServer()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/svc/M"}, func(context.Context, any) (any, error) {
			q.ran <- struct{}{}
			return nil, nil
		})
		q.result <- err
	}()
	select {
	case <-q.clk.armed: // the call waits in the queue
	case err := <-q.result:
		t.Fatalf("the call returned %v at once, want it queued", err)
	}
	return q
}

func (q *queued) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-q.result:
		return err
	case <-time.After(10 * time.Second): // a hang, not a measurement
		t.Fatal("the queued call did not return")
		return nil
	}
}

// TestAdmissionQueueAdmits: a call that meets the full limit waits in the
// queue and runs once the slot is free.
func TestAdmissionQueueAdmits(t *testing.T) {
	q := startQueued(t, ctxTimeout(t, 10*time.Second))
	if got := q.i.Admission().Stats().Queue; got != 1 {
		t.Fatalf("Stats.Queue: got %d, want 1", got)
	}
	q.held.Release(admission.Measured)
	if err := q.wait(t); err != nil {
		t.Fatalf("queued call: %v, want it admitted", err)
	}
	select {
	case <-q.ran:
	default:
		t.Fatal("the handler did not run")
	}
	if got := q.i.Admission().InFlight(); got != 0 {
		t.Fatalf("InFlight: got %d, want 0", got)
	}
}

// TestAdmissionQueueTimeout: a call that waited the longest wait is
// refused with Unavailable and the reason queue_timeout, and a pushback
// delay (a first attempt); its handler never runs.
func TestAdmissionQueueTimeout(t *testing.T) {
	q := startQueued(t, ctxTimeout(t, 10*time.Second))
	defer q.held.Release(admission.Ignored)
	q.clk.Advance(100 * time.Millisecond)
	if err := q.wait(t); status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	e := <-q.events
	if e.Admission != AdmissionQueueTimeout || e.Code != codes.Unavailable || e.Delay < time.Millisecond {
		t.Fatalf("event: got reason %v code %v pushback %v, want queue_timeout, Unavailable, >= 1ms", e.Admission, e.Code, e.Delay)
	}
	if AdmissionQueueTimeout.String() != "queue_timeout" {
		t.Fatalf("String: got %q", AdmissionQueueTimeout.String())
	}
	select {
	case <-q.ran:
		t.Fatal("the handler ran")
	default:
	}
	if st := q.i.Admission().Stats(); st.RejectedQueue != 1 || st.Queue != 0 {
		t.Fatalf("stats: got %+v, want RejectedQueue 1, Queue 0", st)
	}
}

// TestAdmissionQueueCallerGone: a caller that leaves while its request
// waits ends the wait at once, with Canceled and the reason caller_gone.
func TestAdmissionQueueCallerGone(t *testing.T) {
	ctx, cancel := context.WithCancel(ctxTimeout(t, 10*time.Second))
	q := startQueued(t, ctx)
	defer q.held.Release(admission.Ignored)
	cancel()
	if err := q.wait(t); status.Code(err) != codes.Canceled {
		t.Fatalf("got %v, want Canceled", err)
	}
	if e := <-q.events; e.Admission != AdmissionCallerGone || e.Code != codes.Canceled {
		t.Fatalf("event: got reason %v code %v, want caller_gone, Canceled", e.Admission, e.Code)
	}
	if got := q.i.Admission().Queue(); got != 0 {
		t.Fatalf("Queue: got %d, want 0", got)
	}
}

// queueStream is a server stream whose context is ctx.
type queueStream struct {
	grpc.ServerStream
	ctx     context.Context
	trailer metadata.MD
}

func (s *queueStream) Context() context.Context  { return s.ctx }
func (s *queueStream) SetTrailer(md metadata.MD) { s.trailer = metadata.Join(s.trailer, md) }

// TestAdmissionQueueStream: a stream waits in the queue like a unary
// call, and a stream that times out there is refused before its handler
// with the shed trailer.
func TestAdmissionQueueStream(t *testing.T) {
	clk := &queueClock{Fake: clock.NewFake(time.Now()), armed: make(chan struct{}, 4)}
	cfg := admission.Config{MaxInFlight: 1, QueueSize: 4, QueueTimeout: 100 * time.Millisecond, Clock: clk}
	i := mustNew(t, WithAdmission(cfg))
	held, err := i.Admission().Acquire(admission.ClassFirst, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	start := func() (chan error, *queueStream) {
		ss := &queueStream{ctx: ctxTimeout(t, 10*time.Second)}
		done := make(chan error, 1)
		go func() {
			done <- i.StreamServer()(nil, ss, &grpc.StreamServerInfo{FullMethod: "/svc/S", IsServerStream: true}, func(any, grpc.ServerStream) error { return nil })
		}()
		select {
		case <-clk.armed:
		case err := <-done:
			t.Fatalf("the stream returned %v at once, want it queued", err)
		}
		return done, ss
	}
	done, ss := start()
	clk.Advance(100 * time.Millisecond)
	if err := <-done; status.Code(err) != codes.Unavailable || len(ss.trailer[MetadataShed]) == 0 {
		t.Fatalf("timed-out stream: got %v, trailer %v; want Unavailable with %s", err, ss.trailer, MetadataShed)
	}
	done, _ = start()
	held.Release(admission.Measured)
	if err := <-done; err != nil {
		t.Fatalf("queued stream after the release: %v, want it admitted", err)
	}
	if got := i.Admission().InFlight(); got != 0 {
		t.Fatalf("InFlight: got %d, want 0", got)
	}
}
