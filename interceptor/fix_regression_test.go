package interceptor

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Regression tests for issue 12's client and server items. Each failed
// before its fix.

// countingLimiter counts what the interceptor tells a limiter, and grants
// every retry.
type countingLimiter struct {
	requests, successes, failures, tries atomic.Int64
}

func (l *countingLimiter) RecordRequest() { l.requests.Add(1) }
func (l *countingLimiter) TryRetry() bool { l.tries.Add(1); return true }
func (l *countingLimiter) RecordOutcome(ok bool) {
	if ok {
		l.successes.Add(1)
	} else {
		l.failures.Add(1)
	}
}
func (l *countingLimiter) Snapshot() budget.Snapshot { return budget.Snapshot{} }

func (l *countingLimiter) option() Option {
	return WithLimiter(func() budget.Limiter { return l })
}

// closedSet is a breaker set that stays closed (it needs 1 000 calls to
// open), so that its counters show every outcome.
func closedSet(t *testing.T) (*breaker.Set, *breaker.Breaker) {
	t.Helper()
	set := mustSet(t, breaker.Config{MinimumCalls: 1000, Clock: frozen()})
	return set, set.Get("payment")
}

// Item 3: a target that hung until the caller's deadline counted for
// nothing (20 such calls left the breaker "closed, Calls:0"); a caller
// that cancels on its own must still count for nothing. A stream that
// runs into its deadline unanswered counts for nothing too: a watch whose
// server has nothing to send sends nothing (TestQuietStreamsDoNotDownTarget).
func TestDeadlineHangCountsAgainstTarget(t *testing.T) {
	t.Run("unary", func(t *testing.T) {
		set, b := closedSet(t)
		var lim countingLimiter
		i := mustNew(t, noWait, WithBreaker(set), lim.option())
		f := &fakeInvoker{hang: true}
		for range 5 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			err := i.UnaryClient()(ctx, "/svc/M", nil, nil, newCC(t), f.invoke)
			cancel()
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("got %v, want DeadlineExceeded", err)
			}
		}
		if s := b.Snapshot(); s.Calls != 5 || s.Failures != 5 {
			t.Fatalf("after 5 hangs: breaker counted %d calls, %d failures; want 5 and 5", s.Calls, s.Failures)
		}
		if got := lim.failures.Load(); got != 5 {
			t.Fatalf("limiter failures: got %d, want 5", got)
		}

		// The caller cancels during the attempt: nothing counts.
		for range 5 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			inv := func(c context.Context, m string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
				cancel()
				return f.invoke(c, m, req, reply, cc, opts...)
			}
			_ = i.UnaryClient()(ctx, "/svc/M", nil, nil, newCC(t), inv)
		}
		if s := b.Snapshot(); s.Calls != 5 {
			t.Fatalf("after 5 cancelled calls: breaker counted %d calls, want still 5", s.Calls)
		}
		if got := lim.failures.Load() + lim.successes.Load(); got != 5 {
			t.Fatalf("limiter outcomes: got %d, want still 5", got)
		}
	})
	t.Run("stream counts for nothing", func(t *testing.T) {
		set, b := closedSet(t)
		i := mustNew(t, noWait, WithBreaker(set))
		fs := &fakeStreamer{plans: []plan{{mode: "before", at: 100}}} // never answers
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		defer cancel()
		cs, err := i.StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("got %v, want DeadlineExceeded", err)
		}
		if s := b.Snapshot(); s.Calls != 0 || s.Failures != 0 {
			t.Fatalf("after a stream unanswered at its deadline: breaker counted %d calls, %d failures; want none", s.Calls, s.Failures)
		}

		// Cancelled by the caller: nothing counts.
		ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
		cs, err = i.StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		_ = cs.RecvMsg(&testsvcv1.BidiResponse{})
		if s := b.Snapshot(); s.Calls != 0 {
			t.Fatalf("after a cancelled stream: breaker counted %d calls, want still none", s.Calls)
		}
	})
}

// recovering runs f as a recovery interceptor further out would: a panic
// becomes an Unavailable error.
func recovering(f func() error) (err error, panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			err, panicked = status.Errorf(codes.Unavailable, "panic: %v", r), true
		}
	}()
	return f(), false
}

// Item 4: a panic during a half-open probe kept the probe's slot, so that
// after HalfOpenProbes such panics the breaker refused every call forever.
func TestPanicFreesProbe(t *testing.T) {
	t.Run("unary", func(t *testing.T) {
		set, b := halfOpenSet(t)
		i := mustNew(t, noWait, WithBreaker(set))
		boom := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			panic("codec bug")
		}
		if _, panicked := recovering(func() error {
			return i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), boom)
		}); !panicked {
			t.Fatal("the invoker's panic did not reach the recovery")
		}
		f := &fakeInvoker{results: []error{nil}}
		if err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke); err != nil {
			t.Fatalf("the call after the panic: %v, want a probe that succeeds", err)
		}
		if got := b.State(); got != breaker.Closed {
			t.Fatalf("breaker %v, want closed by the probe after the panic", got)
		}
	})
	t.Run("stream", func(t *testing.T) {
		set, b := halfOpenSet(t)
		i := mustNew(t, noWait, WithBreaker(set))
		boom := func(context.Context, *grpc.StreamDesc, *grpc.ClientConn, string, ...grpc.CallOption) (grpc.ClientStream, error) {
			panic("streamer bug")
		}
		if _, panicked := recovering(func() error {
			_, err := i.StreamClient()(ctxTimeout(t, time.Minute), bidiDesc, newCC(t), "/svc/Bidi", boom)
			return err
		}); !panicked {
			t.Fatal("the streamer's panic did not reach the recovery")
		}
		fs := &fakeStreamer{plans: []plan{{mode: "ok"}}}
		cs, err := i.StreamClient()(ctxTimeout(t, time.Minute), bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
		if err != nil {
			t.Fatalf("the stream after the panic: %v, want a probe", err)
		}
		_ = cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"})
		if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); err != nil {
			t.Fatal(err)
		}
		if got := b.State(); got != breaker.Closed {
			t.Fatalf("breaker %v, want closed by the probe after the panic", got)
		}
	})
}

// panicStream is a stream whose RecvMsg panics, a bug in an interceptor
// or codec further in.
type panicStream struct{ downStream }

func (p *panicStream) RecvMsg(any) error { panic("codec bug") }

// A sibling of item 4: a panic in the attempt's RecvMsg kept a half-open
// probe's permit as long as the caller's context lived.
func TestRecvPanicFreesProbe(t *testing.T) {
	set, b := halfOpenSet(t)
	i := mustNew(t, noWait, WithBreaker(set))
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		return &panicStream{downStream{ctx: ctx}}, nil
	}
	ctx := ctxTimeout(t, time.Minute) // lives on: only the fix frees the permit
	cs, err := i.StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", streamer)
	if err != nil {
		t.Fatal(err)
	}
	if _, panicked := recovering(func() error { return cs.RecvMsg(&testsvcv1.BidiResponse{}) }); !panicked {
		t.Fatal("the panic did not reach the recovery")
	}
	f := &fakeInvoker{results: []error{nil}}
	if err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke); err != nil {
		t.Fatalf("the call after the panic: %v, want a probe that succeeds", err)
	}
	if got := b.State(); got != breaker.Closed {
		t.Fatalf("breaker %v, want closed by the probe after the panic", got)
	}
}

// Item 5: the replay buffer outlived the commit: a committed long-lived
// stream kept every message sent before it.
func TestReplayBufferFreedAtCommit(t *testing.T) {
	fs := &fakeStreamer{plans: []plan{{mode: "ok"}}}
	cs, err := mustNew(t, noWait).StreamClient()(ctxTimeout(t, time.Minute), bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
	if err != nil {
		t.Fatal(err)
	}
	rs := cs.(*retryStream)
	buffered := func() int {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		return len(rs.buf)
	}
	for _, id := range ids(5) {
		if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
	}
	if n := buffered(); n != 5 {
		t.Fatalf("before the commit: %d messages kept, want 5", n)
	}
	if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); err != nil {
		t.Fatal(err)
	}
	if n := buffered(); n != 0 {
		t.Fatalf("after the commit: %d messages kept, want 0", n)
	}
	_ = cs.SendMsg(&testsvcv1.BidiRequest{Id: "5"})
	if n := buffered(); n != 0 {
		t.Fatalf("a send after the commit: %d messages kept, want 0", n)
	}
}

// Item 6: calls an open breaker refused were recorded as budget requests,
// so that after an outage the budget granted retries for requests never
// sent.
func TestRefusedCallsRecordNoRequest(t *testing.T) {
	set := mustSet(t, breaker.Config{MinimumCalls: 1, Clock: clock.NewFake(time.Unix(0, 0))})
	p, _ := set.Get("payment").Allow()
	p.Done(breaker.Failure)
	var lim countingLimiter
	i := mustNew(t, noWait, WithBreaker(set), lim.option())
	f := &fakeInvoker{results: []error{nil}}
	for range 100 {
		if err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke); !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("got %v, want the open breaker's refusal", err)
		}
		fs := &fakeStreamer{plans: []plan{{mode: "ok"}}}
		if _, err := i.StreamClient()(ctxTimeout(t, time.Minute), bidiDesc, newCC(t), "/svc/Bidi", fs.streamer); !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("stream: got %v, want the open breaker's refusal", err)
		}
	}
	if got := lim.requests.Load(); got != 0 || len(f.seen) != 0 {
		t.Fatalf("%d attempts sent, %d budget requests recorded; want 0 and 0", len(f.seen), got)
	}

	// A call that goes out is one request, however many attempts it makes.
	i = mustNew(t, noWait, lim.option())
	f = &fakeInvoker{results: []error{errUnavailable, nil}}
	_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	if got := lim.requests.Load(); got != 1 || len(f.seen) != 2 {
		t.Fatalf("%d attempts, %d requests recorded; want 2 and 1", len(f.seen), got)
	}
}

// Item 15: cancelling during the backoff returned the last attempt's
// UNAVAILABLE, where grpc-go's own retry returns CANCELED.
func TestUnaryCancelDuringBackoff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var waits int
	sleep := withSleep(func(ctx context.Context, d time.Duration) error {
		waits++
		cancel() // the caller gives up while the call waits to retry
		return ctx.Err()
	})
	f := &fakeInvoker{results: []error{errUnavailable}}
	err := mustNew(t, sleep).UnaryClient()(ctx, "/svc/M", nil, nil, newCC(t), f.invoke)
	if status.Code(err) != codes.Canceled || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want Canceled with errors.Is(err, context.Canceled)", err)
	}
	var se *Error
	if !errors.As(err, &se) || se.Reason != StopCanceled || se.Attempts != 1 || !errors.Is(err, errUnavailable) {
		t.Fatalf("got %v, want a stormguard error: 1 attempt, stopped as cancelled, unwrapping to the attempt's error", err)
	}
	if len(f.seen) != 1 || waits != 1 {
		t.Fatalf("%d attempts, %d waits; want 1 and 1", len(f.seen), waits)
	}
}

// trailerStream records the trailers a stream server interceptor sets.
type trailerStream struct {
	grpc.ServerStream
	mu sync.Mutex
	md metadata.MD
}

func (r *trailerStream) Context() context.Context { return context.Background() }
func (r *trailerStream) SetTrailer(md metadata.MD) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.md = metadata.Join(r.md, md)
}

// trailerTransport is a trailerStream as the ServerTransportStream of a
// unary call, where grpc.SetTrailer writes.
type trailerTransport struct{ *trailerStream }

func (r trailerTransport) Method() string               { return "/svc/M" }
func (r trailerTransport) SetHeader(metadata.MD) error  { return nil }
func (r trailerTransport) SendHeader(metadata.MD) error { return nil }
func (r trailerTransport) SetTrailer(md metadata.MD) error {
	r.trailerStream.SetTrailer(md)
	return nil
}

func (r *trailerStream) pushback() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.md.Get(MetadataPushback)
}

// Item 8: a handler that panicked after one of its calls gave up sent no
// "do not retry" trailer, so that when a recovery interceptor further out
// answered with a retryable code the tier above retried.
func TestDontRetryTrailerOnPanic(t *testing.T) {
	for _, gaveUp := range []bool{true, false} {
		want := 0
		if gaveUp {
			want = 1
		}
		s := &server{retryable: codeBit(codes.Unavailable)}
		handlerBody := func(ctx context.Context) {
			if gaveUp {
				stateFrom(ctx).gaveUp.Store(true)
			}
			panic("handler bug")
		}

		rec := &trailerStream{}
		ctx := grpc.NewContextWithServerTransportStream(context.Background(), trailerTransport{rec})
		_, panicked := recovering(func() error {
			_, err := s.unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/svc/M"}, func(ctx context.Context, _ any) (any, error) {
				handlerBody(ctx)
				return nil, nil
			})
			return err
		})
		if !panicked || len(rec.pushback()) != want {
			t.Errorf("unary, gave up %v: panic passed on %v, pushback trailer %v; want true and %d value(s)", gaveUp, panicked, rec.pushback(), want)
		}

		rec = &trailerStream{}
		_, panicked = recovering(func() error {
			return s.stream(nil, rec, &grpc.StreamServerInfo{FullMethod: "/svc/M"}, func(_ any, ss grpc.ServerStream) error {
				handlerBody(ss.Context())
				return nil
			})
		})
		if !panicked || len(rec.pushback()) != want {
			t.Errorf("stream, gave up %v: panic passed on %v, pushback trailer %v; want true and %d value(s)", gaveUp, panicked, rec.pushback(), want)
		}
	}
}

// headerFake is an attempt for TestHeaderDoesNotWaitForRecv. The first
// attempt fails at once; the first call of its Header (nil: no headers)
// returns only once the second attempt's RecvMsg is waiting, later calls
// at once. The second attempt has headers at once and echoes what it is
// sent.
type headerFake struct {
	downStream
	first        bool
	headerCalled chan struct{} // closed when the first attempt's Header is first called
	recvWaiting  chan struct{} // closed when the second attempt's RecvMsg waits
	sent         chan string
	calls        atomic.Int32
}

func (h *headerFake) Header() (metadata.MD, error) {
	if !h.first {
		return metadata.Pairs("x-attempt", "2"), nil
	}
	if h.calls.Add(1) == 1 {
		close(h.headerCalled)
		<-h.recvWaiting
	}
	return nil, nil
}

func (h *headerFake) SendMsg(m any) error {
	if h.first {
		return nil
	}
	h.sent <- m.(*testsvcv1.BidiRequest).GetId()
	return nil
}

func (h *headerFake) RecvMsg(m any) error {
	if h.first {
		return status.Error(codes.Unavailable, "down")
	}
	close(h.recvWaiting)
	select {
	case id := <-h.sent:
		m.(*testsvcv1.BidiResponse).Id = id
		return nil
	case <-h.ctx.Done():
		return status.FromContextError(h.ctx.Err()).Err()
	}
}

// TestHeaderDoesNotWaitForRecv: a Header that learned its attempt ended
// without headers after a concurrent RecvMsg had already retried it must
// not wait for that RecvMsg, which may wait for a message the caller of
// Header is about to send.
func TestHeaderDoesNotWaitForRecv(t *testing.T) {
	headerCalled, recvWaiting := make(chan struct{}), make(chan struct{})
	n := 0
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		n++
		return &headerFake{downStream: downStream{ctx: ctx}, first: n == 1, headerCalled: headerCalled, recvWaiting: recvWaiting, sent: make(chan string, 1)}, nil
	}
	ctx := ctxTimeout(t, 5*time.Second)
	cs, err := mustNew(t, noWait).StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", streamer)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		md  metadata.MD
		id  string
		err error
	}
	header, recvd := make(chan result, 1), make(chan result, 1)
	go func() {
		md, err := cs.Header()
		header <- result{md: md, err: err}
	}()
	<-headerCalled
	go func() {
		var m testsvcv1.BidiResponse
		err := cs.RecvMsg(&m)
		recvd <- result{id: m.GetId(), err: err}
	}()
	h := <-header
	if got := h.md.Get("x-attempt"); h.err != nil || len(got) != 1 || got[0] != "2" {
		t.Fatalf("Header: %v, %v; want the second attempt's header", h.md, h.err)
	}
	if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"}); err != nil {
		t.Fatal(err)
	}
	if r := <-recvd; r.err != nil || r.id != "0" {
		t.Fatalf("RecvMsg: %q, %v; want the echo of 0", r.id, r.err)
	}
}

// The same as item 15 for a stream whose first attempt could not open: the
// caller cancels while the stream waits to retry.
func TestStreamOpenCancelDuringBackoff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sleep := withSleep(func(ctx context.Context, d time.Duration) error {
		cancel()
		return ctx.Err()
	})
	opened := 0
	streamer := func(context.Context, *grpc.StreamDesc, *grpc.ClientConn, string, ...grpc.CallOption) (grpc.ClientStream, error) {
		opened++
		return nil, status.Error(codes.Unavailable, "connecting")
	}
	_, err := mustNew(t, sleep).StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", streamer)
	if status.Code(err) != codes.Canceled || !errors.Is(err, context.Canceled) || opened != 1 {
		t.Fatalf("got %v after %d attempts, want Canceled (errors.Is context.Canceled) after 1", err, opened)
	}
}
