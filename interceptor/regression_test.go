package interceptor

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Regression tests for bugs found in review. Each failed before its fix.

// downStream is a stream whose every receive fails with Unavailable and
// whose trailer is fixed.
type downStream struct {
	ctx     context.Context
	trailer metadata.MD
}

func (d *downStream) SendMsg(any) error            { return nil }
func (d *downStream) CloseSend() error             { return nil }
func (d *downStream) RecvMsg(any) error            { return status.Error(codes.Unavailable, "down") }
func (d *downStream) Header() (metadata.MD, error) { return nil, nil }
func (d *downStream) Trailer() metadata.MD         { return d.trailer }
func (d *downStream) Context() context.Context     { return d.ctx }

// A pushback too large for time.Duration ended a stream's retries in a busy
// loop on the failed attempt.
func TestStreamHugePushback(t *testing.T) {
	var opened int
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		opened++
		return &downStream{ctx: ctx, trailer: metadata.Pairs(MetadataPushback, "9223372036855")}, nil
	}
	ctx := ctxTimeout(t, 10*time.Second)
	cs, err := mustNew(t, noWait).StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", streamer)
	if err != nil {
		t.Fatal(err)
	}
	err = cs.RecvMsg(&testsvcv1.BidiResponse{})
	if status.Code(err) != codes.Unavailable || ctx.Err() != nil || opened != DefaultMaxAttempts {
		t.Fatalf("got %v after %d attempts (context %v), want Unavailable after %d", err, opened, ctx.Err(), DefaultMaxAttempts)
	}
}

// A first stream attempt that failed with a zero backoff was handed to the
// application as a ready stream with no attempt in it (nil dereference).
func TestStreamZeroBackoffRetry(t *testing.T) {
	calls := 0
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		calls++
		if calls == 1 {
			return nil, status.Error(codes.Unavailable, "connecting")
		}
		return newFakeStream(ctx, plan{mode: "ok"}), nil
	}
	i := mustNew(t, WithBackoff(Backoff{Base: time.Nanosecond, Cap: time.Nanosecond}), withRand(func() float64 { return 0 }))
	cs, err := i.StreamClient()(ctxTimeout(t, 10*time.Second), bidiDesc, newCC(t), "/svc/Bidi", streamer)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Fatalf("stream handed out after %d streamer calls, want 2 (the failed one and its retry)", calls)
	}
	_ = cs.CloseSend()
	if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); !errors.Is(err, io.EOF) {
		t.Fatalf("got %v, want io.EOF", err)
	}
}

// oneShot is a client stream that answers once; gRPC's RecvMsg of a client
// stream returns that answer and has already seen the end.
type oneShot struct {
	ctx  context.Context
	done bool
}

func (o *oneShot) SendMsg(any) error { return nil }
func (o *oneShot) CloseSend() error  { return nil }
func (o *oneShot) RecvMsg(any) error {
	if o.done {
		return io.EOF
	}
	o.done = true
	return nil
}
func (o *oneShot) Header() (metadata.MD, error) { return metadata.MD{}, nil }
func (o *oneShot) Trailer() metadata.MD         { return nil }
func (o *oneShot) Context() context.Context     { return o.ctx }

// A successful client stream (CloseAndRecv: one RecvMsg that returns the
// answer) was never reported: the breaker saw only failures and opened on
// a healthy target. (Every attempt context stayed alive too; a first
// attempt now runs in the caller's context, which gRPC's own stream
// derives from and cancels when it ends.)
func TestClientStreamSuccessIsReported(t *testing.T) {
	set := mustSet(t, breaker.Config{MinimumCalls: 5, Clock: frozen()})
	var ctxs []context.Context
	fail := false
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		if fail {
			return nil, status.Error(codes.Unavailable, "blip")
		}
		ctxs = append(ctxs, ctx)
		return &oneShot{ctx: ctx}, nil
	}
	desc := &grpc.StreamDesc{StreamName: "Upload", ClientStreams: true}
	i := mustNew(t, noWait, WithBreaker(set), WithMaxAttempts(1))
	parent := ctxTimeout(t, 10*time.Second)
	for range 95 {
		cs, err := i.StreamClient()(parent, desc, newCC(t), "/svc/Upload", streamer)
		if err != nil {
			t.Fatal(err)
		}
		_ = cs.SendMsg(&testsvcv1.BidiRequest{Id: "x"})
		_ = cs.CloseSend()
		if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); err != nil {
			t.Fatal(err)
		}
	}
	if len(ctxs) != 95 {
		t.Fatalf("streams opened: %d, want 95", len(ctxs))
	}
	if s := set.Get("payment").Snapshot(); s.Calls != 95 {
		t.Fatalf("breaker after 95 successful client streams: %+v, want 95 calls reported", s)
	}
	fail = true
	for range 5 {
		_, _ = i.StreamClient()(parent, desc, newCC(t), "/svc/Upload", streamer)
	}
	if s := set.Get("payment").Snapshot(); s.State != breaker.Closed || s.Calls != 100 {
		t.Fatalf("breaker after 95 successes and 5 failures: %+v, want closed with 100 calls", s)
	}
}

// The same over grpc-go: generated CloseAndRecv calls are reported.
func TestClientStreamSuccessIsReportedOverGRPC(t *testing.T) {
	set := mustSet(t, breaker.Config{Clock: frozen()})
	c := testsvc.New(t, testsvc.Config{
		DialOptions: func(hop int) []grpc.DialOption {
			if hop == 0 {
				return mustNew(t, noWait, WithBreaker(set)).DialOptions()
			}
			return mustNew(t, noWait).DialOptions()
		},
		ServerOptions: func(int) []grpc.ServerOption { return mustNew(t).ServerOptions() },
	})
	for range 20 {
		cs, err := c.Client().ClientStream(ctxTimeout(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		_ = cs.Send(&testsvcv1.ClientStreamRequest{Id: "a"})
		if _, err := cs.CloseAndRecv(); err != nil {
			t.Fatal(err)
		}
	}
	if s := set.Get("gateway").Snapshot(); s.Calls != 20 || s.Failures != 0 {
		t.Fatalf("breaker after 20 successful client streams: %+v, want 20 calls, 0 failures", s)
	}
}

// A stream abandoned before its commit (the caller cancels and never calls
// RecvMsg again, as gRPC allows) held a half-open probe slot forever.
func TestAbandonedStreamFreesProbe(t *testing.T) {
	set, b := halfOpenSet(t)

	fs := &fakeStreamer{plans: []plan{{mode: "before", at: 100}}} // never answers
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := mustNew(t, WithBreaker(set)).StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Allow(); !errors.Is(err, breaker.ErrOpen) {
		t.Fatal("the stream's probe did not take the only slot")
	}
	cancel() // abandon
	// The slot is freed by a context.AfterFunc, on its own goroutine.
	wait := ctxTimeout(t, 10*time.Second)
	for {
		p, err := b.Allow()
		if err == nil {
			p.Done(breaker.Ignored)
			return
		}
		select {
		case <-wait.Done():
			t.Fatalf("the abandoned stream still holds the probe slot (breaker %v)", b.State())
		case <-time.After(time.Millisecond):
		}
	}
}

// The replay buffer overflowing while a retry waited let the retry go out
// with an empty buffer: the server never saw the first message and the
// application saw a clean end.
func TestCommitDuringBackoffStopsRetry(t *testing.T) {
	sleeping, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	sleep := withSleep(func(ctx context.Context, _ time.Duration) error {
		once.Do(func() { close(sleeping) })
		<-release
		return ctx.Err()
	})
	fs := &fakeStreamer{plans: []plan{{mode: "before", at: 1}, {mode: "ok"}}}
	cs, err := mustNew(t, sleep, WithReplayBufferSize(16)).StreamClient()(ctxTimeout(t, 10*time.Second), bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"}); err != nil {
		t.Fatal(err)
	}
	recvErr := make(chan error, 1)
	go func() { recvErr <- cs.RecvMsg(&testsvcv1.BidiResponse{}) }()
	<-sleeping
	_ = cs.SendMsg(&testsvcv1.BidiRequest{Id: strings.Repeat("1", 32)}) // outgrows the buffer: commit
	close(release)
	err = <-recvErr
	var se *Error
	if !errors.As(err, &se) || se.Reason != StopCommitted || len(fs.attempts) != 1 {
		t.Fatalf("got %v after %d attempts, want a stop for the commit and no second attempt", err, len(fs.attempts))
	}
}

// A stream committed by its replay buffer, not by an answer, closed a
// half-open breaker as if the target had answered.
func TestBufferCommitIsNotAnAnswer(t *testing.T) {
	set, b := halfOpenSet(t)
	fs := &fakeStreamer{plans: []plan{{mode: "before", at: 100}}} // hung target
	cs, err := mustNew(t, WithBreaker(set), WithReplayBufferSize(4)).StreamClient()(ctxTimeout(t, 10*time.Second), bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
	if err != nil {
		t.Fatal(err)
	}
	_ = cs.SendMsg(&testsvcv1.BidiRequest{Id: "0123456789"})
	if got := b.State(); got != breaker.HalfOpen {
		t.Fatalf("breaker %v after a buffer commit, want still half-open", got)
	}
}

// A handler answering NotFound after one of its calls gave up sent "do not
// retry", and the caller's breaker counted NotFound with that trailer, or a
// success with a malformed one, as failures.
func TestDontRetryOnlyForRetryableCodes(t *testing.T) {
	s := &server{retryable: codeBit(codes.Unavailable)}
	sc := s.begin(context.Background(), "/svc/M")
	sc.st.gaveUp.Store(true)
	if s.dontRetryNeeded(sc, "/svc/M", status.Error(codes.NotFound, "no such order")) {
		t.Fatal("server sends do-not-retry with NotFound")
	}
	if !s.dontRetryNeeded(sc, "/svc/M", status.Error(codes.Unavailable, "payment down")) {
		t.Fatal("server does not send do-not-retry with Unavailable")
	}
	for _, tt := range []struct {
		result   error
		pushback string
	}{
		{status.Error(codes.NotFound, "no such order"), "-1"},
		{nil, "abc"},
		{nil, "-1"},
	} {
		set := mustSet(t, breaker.Config{MinimumCalls: 1, Clock: frozen()})
		f := &fakeInvoker{results: []error{tt.result}, pushbacks: []string{tt.pushback}}
		_ = mustNew(t, noWait, WithBreaker(set)).UnaryClient()(ctxTimeout(t, 10*time.Second), "/svc/M", nil, nil, newCC(t), f.invoke)
		if s := set.Get("payment").Snapshot(); s.Failures != 0 {
			t.Errorf("%v with pushback %q: the breaker counted a failure", tt.result, tt.pushback)
		}
	}
}

// DeadlineExceeded from the server (its own downstream timed out) was
// retried under a per-attempt timeout that never fired.
func TestServerDeadlineNotRetried(t *testing.T) {
	f := &fakeInvoker{results: []error{status.Error(codes.DeadlineExceeded, "server's own downstream timed out")}}
	_ = mustNew(t, noWait, WithPerAttemptTimeout(time.Hour)).UnaryClient()(ctxTimeout(t, 10*time.Second), "/svc/M", nil, nil, newCC(t), f.invoke)
	if len(f.seen) != 1 {
		t.Fatalf("server-side DeadlineExceeded: %d attempts, want 1", len(f.seen))
	}
}
