package interceptor

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// plan says how one fake attempt behaves:
//   - "before": fail (trailers only, no headers) once at requests were
//     received, answering none;
//   - "after": echo, headers with the first answer, and fail once at
//     requests are answered;
//   - "ok": echo all, headers with the first answer, end with io.EOF
//     after the half-close;
//   - "hdrfail": send headers once at requests were received, then fail;
//   - "hold": send headers at once, then nothing until the context ends.
type plan struct {
	mode string
	at   int
}

// fakeStream is a bidi echo stream that follows a plan, with gRPC's
// semantics for Header (it waits for the headers or the end, and returns
// nil for an attempt that ended without headers) and for SendMsg (io.EOF
// once the attempt ended, an error of the client's own after CloseSend).
type fakeStream struct {
	ctx  context.Context
	plan plan

	mu       sync.Mutex
	changed  chan struct{}
	sent     []string
	closed   bool
	answered int
	headers  bool
	ended    error
}

func newFakeStream(ctx context.Context, p plan) *fakeStream {
	return &fakeStream{ctx: ctx, plan: p, changed: make(chan struct{})}
}

func (f *fakeStream) signalLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeStream) SendMsg(m any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended != nil || f.ctx.Err() != nil {
		return io.EOF
	}
	if f.closed {
		return status.Error(codes.Internal, "SendMsg called after CloseSend")
	}
	f.sent = append(f.sent, m.(*testsvcv1.BidiRequest).GetId())
	f.signalLocked()
	return nil
}

func (f *fakeStream) CloseSend() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.signalLocked()
	return nil
}

// endLocked ends the attempt with err.
func (f *fakeStream) endLocked(err error) {
	f.ended = err
	f.signalLocked()
}

// stepLocked advances the fake by its plan; it reports whether an
// answer is ready.
func (f *fakeStream) stepLocked() bool {
	switch {
	case f.ended != nil:
		return false
	case f.ctx.Err() != nil:
		f.endLocked(status.FromContextError(f.ctx.Err()).Err())
		return false
	}
	switch f.plan.mode {
	case "hold":
		if !f.headers {
			f.headers = true
			f.signalLocked()
		}
		return false
	case "before":
		if len(f.sent) >= f.plan.at {
			f.endLocked(status.Error(codes.Unavailable, "fake failure"))
		}
		return false
	case "hdrfail":
		if len(f.sent) >= f.plan.at {
			f.headers = true
			f.endLocked(status.Error(codes.Unavailable, "fake failure after headers"))
		}
		return false
	case "after":
		if f.answered >= f.plan.at {
			f.endLocked(status.Error(codes.Unavailable, "fake failure"))
			return false
		}
	}
	if f.answered < len(f.sent) {
		if !f.headers {
			f.headers = true
			f.signalLocked()
		}
		return true
	}
	if f.closed {
		f.headers = true
		f.endLocked(io.EOF)
	}
	return false
}

// wait waits for a change of the fake, or for its context to end.
func (f *fakeStream) wait(ch chan struct{}) {
	select {
	case <-ch:
	case <-f.ctx.Done():
	}
}

func (f *fakeStream) RecvMsg(m any) error {
	for {
		f.mu.Lock()
		if f.stepLocked() {
			m.(*testsvcv1.BidiResponse).Id = f.sent[f.answered]
			f.answered++
			f.mu.Unlock()
			return nil
		}
		if f.ended != nil {
			err := f.ended
			f.mu.Unlock()
			return err
		}
		ch := f.changed
		f.mu.Unlock()
		f.wait(ch)
	}
}

func (f *fakeStream) Header() (metadata.MD, error) {
	for {
		f.mu.Lock()
		f.stepLocked()
		switch {
		case f.headers:
			f.mu.Unlock()
			return metadata.MD{}, nil
		case f.ended != nil:
			f.mu.Unlock()
			return nil, nil
		}
		ch := f.changed
		f.mu.Unlock()
		f.wait(ch)
	}
}

func (f *fakeStream) Trailer() metadata.MD     { return nil }
func (f *fakeStream) Context() context.Context { return f.ctx }

// fakeStreamer hands out fake attempts that follow plans in order (the
// last one repeats) and keeps them for inspection.
type fakeStreamer struct {
	mu       sync.Mutex
	plans    []plan
	attempts []*fakeStream
}

func (fs *fakeStreamer) streamer(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	p := fs.plans[min(len(fs.attempts), len(fs.plans)-1)]
	s := newFakeStream(ctx, p)
	fs.attempts = append(fs.attempts, s)
	return s, nil
}

// halfOpenSet returns a breaker set whose breaker for the test target is
// open with its interval passed: the next Allow is its one half-open probe.
func halfOpenSet(t *testing.T) (*breaker.Set, *breaker.Breaker) {
	t.Helper()
	fc := clock.NewFake(time.Unix(0, 0))
	set := mustSet(t, breaker.Config{MinimumCalls: 1, HalfOpenProbes: 1, Clock: fc, Jitter: breaker.NoJitter})
	b := set.Get("payment")
	p, _ := b.Allow()
	p.Done(breaker.Failure)
	fc.Advance(time.Minute)
	return set, b
}

var bidiDesc = &grpc.StreamDesc{StreamName: "Bidi", ServerStreams: true, ClientStreams: true}

// Sender, receiver and Header in three goroutines, with retries, headers
// then failures, trailers-only failures and cancellation (400 seeded
// plans): every attempt gets a prefix of the messages in order, none
// that sent headers is retried, every retry's context is cancelled at
// the end, and every attempt started is reported ended once.
func TestStreamInterleavings(t *testing.T) {
	for seed := range uint64(400) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 11))
			msgs := 1 + r.IntN(5)
			modes := []string{"before", "hdrfail", "after"}
			var plans []plan
			for range 4 {
				m := modes[r.IntN(3)]
				at := r.IntN(msgs + 1)
				if m == "after" && r.IntN(2) == 0 {
					m = "ok"
				}
				plans = append(plans, plan{mode: m, at: at})
			}
			cancelAt := -1
			if r.IntN(5) == 0 {
				cancelAt = r.IntN(msgs)
			}
			useHeader := r.IntN(2) == 0
			rec := &recorder{}
			fs := &fakeStreamer{plans: plans}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			i := mustNew(t, noWait, WithObserver(rec))
			cs, err := i.StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := range msgs {
					if n == cancelAt {
						cancel()
					}
					if cs.SendMsg(&testsvcv1.BidiRequest{Id: strconv.Itoa(n)}) != nil {
						return
					}
				}
				_ = cs.CloseSend()
			}()
			if useHeader {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _ = cs.Header()
				}()
			}
			var got []string
			var end error
			for {
				var m testsvcv1.BidiResponse
				if end = cs.RecvMsg(&m); end != nil {
					break
				}
				got = append(got, m.GetId())
			}
			wg.Wait()

			want := ids(msgs)
			if !slices.Equal(got, want[:min(len(got), msgs)]) || len(got) > msgs {
				t.Fatalf("received %v, want a prefix of %v", got, want)
			}
			if errors.Is(end, io.EOF) && len(got) != msgs {
				t.Fatalf("EOF after %v", got)
			}
			fs.mu.Lock()
			attempts := slices.Clone(fs.attempts)
			fs.mu.Unlock()
			if len(attempts) > DefaultMaxAttempts {
				t.Fatalf("%d attempts", len(attempts))
			}
			for k, a := range attempts {
				a.mu.Lock()
				sent, closed, headers, ended := slices.Clone(a.sent), a.closed, a.headers, a.ended
				a.mu.Unlock()
				if !slices.Equal(sent, want[:min(len(sent), msgs)]) {
					t.Fatalf("attempt %d got %v, want a prefix of %v", k, sent, want)
				}
				if errors.Is(ended, io.EOF) && (!closed || len(sent) != msgs) {
					t.Fatalf("attempt %d ended cleanly with %v closed=%v", k, sent, closed)
				}
				if headers && k < len(attempts)-1 {
					t.Fatalf("attempt %d sent headers and was retried (plans %v)", k, plans)
				}
				if k > 0 && a.ctx.Err() == nil {
					t.Fatalf("attempt %d: context not cancelled after the stream ended with %v (plans %v)", k, end, plans)
				}
			}
			starts, ends := rec.count(EventAttemptStart), rec.count(EventAttemptEnd)
			if starts != len(attempts) || ends != starts {
				t.Fatalf("attempts %d, starts %d, ends %d (plans %v, end %v)", len(attempts), starts, ends, plans, end)
			}
		})
	}
}

// TestStreamCancelDuringBackoff: a stream waiting for its next attempt
// ends as soon as the caller cancels.
func TestStreamCancelDuringBackoff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waiting := make(chan struct{})
	var once sync.Once
	sleep := withSleep(func(ctx context.Context, d time.Duration) error {
		once.Do(func() { close(waiting) })
		return sleepCtx(ctx, time.Hour)
	})
	fs := &fakeStreamer{plans: []plan{{mode: "before", at: 0}}}
	i := mustNew(t, sleep)
	cs, err := i.StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		<-waiting
		cancel()
	}()
	err = cs.RecvMsg(&testsvcv1.BidiResponse{})
	if err == nil || ctx.Err() == nil {
		t.Fatalf("got %v, want the stream to end with the cancelled context", err)
	}
	// One attempt, ended by the cancellation during its backoff: the
	// caller gets Canceled, as from grpc-go's own retry, and no second
	// attempt starts.
	if status.Code(err) != codes.Canceled || !errors.Is(err, context.Canceled) || len(fs.attempts) != 1 {
		t.Fatalf("got %v after %d attempts, want Canceled (errors.Is context.Canceled) and no retry", err, len(fs.attempts))
	}
}

// TestStreamProbeReleasedAtCommit: a half-open probe that is a long-lived
// stream frees its slot (and here closes the breaker) once the stream
// commits, without waiting for the stream to end.
func TestStreamProbeReleasedAtCommit(t *testing.T) {
	set, b := halfOpenSet(t)

	ctx := ctxTimeout(t, 10*time.Second)
	fs := &fakeStreamer{plans: []plan{{mode: "ok"}}}
	cs, err := mustNew(t, WithBreaker(set)).StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.State(); got != breaker.HalfOpen {
		t.Fatalf("after the probe opened: state %v, want half-open", got)
	}
	if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"}); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); err != nil {
		t.Fatal(err)
	}
	if got := b.State(); got != breaker.Closed {
		t.Fatalf("after the first response, stream still open: state %v, want closed", got)
	}
	_ = cs.CloseSend()
	if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); !errors.Is(err, io.EOF) {
		t.Fatalf("end: got %v, want io.EOF", err)
	}
}

func TestStreamInvalidOptions(t *testing.T) {
	fs := &fakeStreamer{plans: []plan{{mode: "ok"}}}
	_, err := StreamClientInterceptor(WithReplayBufferSize(-1))(ctxTimeout(t, time.Second), bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
	if status.Code(err) != codes.Internal || len(fs.attempts) != 0 {
		t.Fatalf("got %v after %d attempts, want Internal and none", err, len(fs.attempts))
	}
	if _, err := New(WithReplayBufferSize(-1)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("New: got %v, want ErrInvalidOption", err)
	}
}

// A stream whose target answered is an accept for the adaptive throttle
// when the answer comes, not when the stream ends: a client that watches
// streams and cancels them (a subscription) never reached the end, its
// served streams counted for nothing, its failed opens as failures, and
// a healthy streaming server was called down after three of them (a
// user's trial over TCP). Here four served-and-cancelled streams alternate
// with four failed opens, 100 ms apart: the target stays up.
func TestStreamAnswerIsAccept(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set := newAdaptive(t, clk, nil)
	i := mustNew(t, WithAdaptive(set), WithMaxAttempts(1))
	for n := range 8 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		p := plan{mode: "ok"}
		if n%2 == 1 {
			p = plan{mode: "before", at: 1}
		}
		fs := &fakeStreamer{plans: []plan{p}}
		cs, err := i.StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
		if err != nil {
			cancel()
			t.Fatalf("stream %d: %v", n, err)
		}
		if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"}); err != nil {
			cancel()
			t.Fatalf("stream %d: send: %v", n, err)
		}
		err = cs.RecvMsg(&testsvcv1.BidiResponse{})
		cancel() // the caller leaves: served or not
		if served := n%2 == 0; served != (err == nil) {
			t.Fatalf("stream %d: receive: %v, want served %v", n, err, served)
		}
		clk.Advance(100 * time.Millisecond)
	}
	var ths []*adaptive.Throttle
	set.Range(func(_ string, th *adaptive.Throttle) bool { ths = append(ths, th); return true })
	if len(ths) != 1 {
		t.Fatalf("%d throttles, want the target's", len(ths))
	}
	th := ths[0]

	if th.Down() || th.Stats().Downs != 0 {
		t.Fatalf("a target that served every other stream: down %v, downs %d; want up", th.Down(), th.Stats().Downs)
	}
}

// SendMsg on an attempt that ended before the commit: retried if the
// stream may be (the new attempt gets the message with the rest, SendMsg
// returns nil), else io.EOF as from gRPC, the status from RecvMsg. It
// returned nil until the replay buffer overflowed, and a caller that
// sends until io.EOF sent into a stream that was over (a user's trial:
// 2 520 sends into a stream the server had refused).
func TestStreamSendAfterEnd(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []Option
		plans   []plan
		sendErr error // of the second SendMsg
		recv    codes.Code
		opened  int
	}{
		{"not retried", []Option{WithMaxAttempts(1)}, []plan{{mode: "before", at: 1}}, io.EOF, codes.Unavailable, 1},
		{"headers before the end", []Option{noWait}, []plan{{mode: "hdrfail", at: 1}}, io.EOF, codes.Unavailable, 1},
		{"retried", []Option{noWait}, []plan{{mode: "before", at: 1}, {mode: "ok"}}, nil, codes.OK, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxTimeout(t, 10*time.Second)
			fs := &fakeStreamer{plans: tc.plans}
			cs, err := mustNew(t, tc.opts...).StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
			if err != nil {
				t.Fatal(err)
			}
			if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"}); err != nil {
				t.Fatalf("first send: %v", err)
			}
			// The fake ends its attempt once it holds the first message;
			// wait for that (its Header returns at the end, or with headers).
			fs.mu.Lock()
			first := fs.attempts[0]
			fs.mu.Unlock()
			_, _ = first.Header()
			if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "1"}); !errors.Is(err, tc.sendErr) || (tc.sendErr == nil) != (err == nil) {
				t.Fatalf("send after the attempt ended: %v, want %v", err, tc.sendErr)
			}
			if tc.recv == codes.OK {
				_ = cs.CloseSend()
				var got []string
				for {
					r := &testsvcv1.BidiResponse{}
					if err := cs.RecvMsg(r); err != nil {
						if !errors.Is(err, io.EOF) {
							t.Fatalf("receive: %v", err)
						}
						break
					}
					got = append(got, r.GetId())
				}
				if !slices.Equal(got, []string{"0", "1"}) {
					t.Fatalf("answers %v, want both messages replayed into the new attempt", got)
				}
			} else if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); status.Code(err) != tc.recv {
				t.Fatalf("receive: %v, want %v", err, tc.recv)
			}
			fs.mu.Lock()
			defer fs.mu.Unlock()
			if len(fs.attempts) != tc.opened {
				t.Fatalf("%d attempts, want %d", len(fs.attempts), tc.opened)
			}
		})
	}
}
