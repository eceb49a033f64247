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

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// plan says how one fake attempt behaves.
type plan struct {
	mode string // "before": fail after receiving at requests, answering none;
	// "after": echo, and fail once at requests are answered; "ok": echo all
	at int
}

// fakeStream is a bidi echo stream that follows a plan.
type fakeStream struct {
	ctx  context.Context
	plan plan

	mu       sync.Mutex
	changed  chan struct{}
	sent     []string
	closed   bool
	answered int
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
	if f.ended != nil {
		return io.EOF
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

func (f *fakeStream) RecvMsg(m any) error {
	for {
		f.mu.Lock()
		if f.ended != nil {
			err := f.ended
			f.mu.Unlock()
			return err
		}
		switch {
		case f.plan.mode == "before" && len(f.sent) >= f.plan.at,
			f.plan.mode == "after" && f.answered >= f.plan.at:
			f.ended = status.Error(codes.Unavailable, "fake failure")
			f.signalLocked()
			f.mu.Unlock()
			return f.ended
		case f.plan.mode != "before" && f.answered < len(f.sent):
			m.(*testsvcv1.BidiResponse).Id = f.sent[f.answered]
			f.answered++
			f.mu.Unlock()
			return nil
		case f.plan.mode != "before" && f.closed:
			f.ended = io.EOF
			f.mu.Unlock()
			return io.EOF
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-f.ctx.Done():
			f.mu.Lock()
			if f.ended == nil {
				f.ended = status.FromContextError(f.ctx.Err()).Err()
			}
			f.mu.Unlock()
		}
	}
}

func (f *fakeStream) Header() (metadata.MD, error) { return nil, nil }
func (f *fakeStream) Trailer() metadata.MD         { return nil }
func (f *fakeStream) Context() context.Context     { return f.ctx }

func (f *fakeStream) record() (sent []string, answered int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sent), f.answered
}

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

// TestStreamInterleavings runs seeded random schedules of sends, receives,
// failures before and after the commit, and cancellation, with the sender
// and the receiver in different goroutines, and checks what must hold
// whatever the interleaving.
func TestStreamInterleavings(t *testing.T) {
	for seed := range uint64(300) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			msgs := 1 + r.IntN(6)
			modes := []string{"before", "after", "ok"}
			var plans []plan
			for range 4 {
				plans = append(plans, plan{mode: modes[r.IntN(3)], at: r.IntN(msgs + 1)})
			}
			cancelAt := -1
			if r.IntN(4) == 0 {
				cancelAt = r.IntN(msgs)
			}
			fs := &fakeStreamer{plans: plans}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			i := mustNew(t, noWait)
			cs, err := i.StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			sendDone := make(chan struct{})
			go func() {
				defer close(sendDone)
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
			var got []string
			var end error
			for {
				var m testsvcv1.BidiResponse
				if end = cs.RecvMsg(&m); end != nil {
					break
				}
				got = append(got, m.GetId())
			}
			<-sendDone

			want := ids(msgs)
			if !slices.Equal(got, want[:min(len(got), msgs)]) || len(got) > msgs {
				t.Fatalf("application received %v: want a prefix of %v, in order, without duplicates", got, want)
			}
			if errors.Is(end, io.EOF) && len(got) != msgs {
				t.Fatalf("clean end after %v, want all of %v", got, want)
			}
			if n := len(fs.attempts); n > DefaultMaxAttempts {
				t.Fatalf("%d attempts, want at most %d", n, DefaultMaxAttempts)
			}
			for k, a := range fs.attempts {
				sent, answered := a.record()
				if !slices.Equal(sent, want[:min(len(sent), msgs)]) {
					t.Fatalf("attempt %d got %v: want a prefix of %v (replay in order, nothing twice)", k, sent, want)
				}
				if answered > 0 && k < len(fs.attempts)-1 {
					t.Fatalf("attempt %d answered %d messages and was retried: no retry after the commit", k, answered)
				}
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
