package interceptor

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// The regressions of the review of the client stream (2026-12-05), each
// failing on the code before its fix (its stress test of the stream's
// concurrency is TestStreamInterleavings).

// A half-open probe stream whose target sent its response headers (it
// answered) and then ran into the caller's deadline while the caller
// waited in RecvMsg, no one having asked for the headers: by the rule
// (an attempt still unanswered at the caller's deadline counts as a
// failure, one that answered for nothing) the breaker must not reopen.
// The watch for the deadline runs first, before RecvMsg looks at the
// headers.
func TestStreamProbeHeadersThenDeadline(t *testing.T) {
	for range 5 {
		set, b := halfOpenSet(t)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		fs := &fakeStreamer{plans: []plan{{mode: "hold"}}}
		cs, err := mustNew(t, WithBreaker(set)).StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
		if err != nil {
			t.Fatal(err)
		}
		_ = cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"})
		err = cs.RecvMsg(&testsvcv1.BidiResponse{})
		cancel()
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("got %v", err)
		}
		if got := b.State(); got == breaker.Open {
			t.Fatalf("probe that answered (headers) then hit the caller's deadline: breaker %v, want not reopened", got)
		}
	}
}

// A probe stream's first attempt runs in the caller's context, watched
// for its abandonment (context.AfterFunc); once the attempt is reported,
// the watch is stopped, so that a long-lived caller's context does not
// keep every ended stream reachable.
func TestStreamWatchStoppedWhenReported(t *testing.T) {
	set, _ := halfOpenSet(t)
	parent, cancelParent := context.WithCancel(context.Background())
	defer cancelParent()
	fs := &fakeStreamer{plans: []plan{{mode: "ok"}}}
	cs, err := mustNew(t, WithBreaker(set)).StreamClient()(parent, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
	if err != nil {
		t.Fatal(err)
	}
	_ = cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"})
	_ = cs.CloseSend()
	for cs.RecvMsg(&testsvcv1.BidiResponse{}) == nil {
	}
	s := cs.(*retryStream)
	if s.first.unwatch == nil {
		t.Fatal("a probe's first attempt is not watched for its abandonment")
	}
	if s.first.unwatch() {
		t.Error("the watch was still registered on the caller's context after the stream ended")
	}
}

// gRPC lets a caller stop after SendMsg returned an error other than
// io.EOF (the stream is over): a retry attempt's own context (a child of
// the caller's) is cancelled then, not left to the caller's.
func TestStreamRetryContextCancelledAfterSendError(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.Background())
	defer cancelParent()
	fs := &fakeStreamer{plans: []plan{{mode: "before", at: 1}, {mode: "ok"}}}
	cs, err := mustNew(t, noWait).StreamClient()(parent, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
	if err != nil {
		t.Fatal(err)
	}
	_ = cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"})
	if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); err != nil { // retried once, then answered
		t.Fatal(err)
	}
	_ = cs.CloseSend()
	if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "1"}); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("SendMsg after CloseSend: %v", err)
	}
	if len(fs.attempts) != 2 {
		t.Fatalf("%d attempts", len(fs.attempts))
	}
	if fs.attempts[1].ctx.Err() == nil {
		t.Errorf("retry attempt's context still live after SendMsg failed (caller obeyed gRPC's contract)")
	}
}

// A half-open probe stream whose SendMsg fails with an error other than
// io.EOF (gRPC ended the stream; the caller may stop there) gives its
// probe slot back at once, not when the caller's context ends (here,
// never).
func TestStreamProbeFreedAfterSendError(t *testing.T) {
	set, b := halfOpenSet(t)
	rec := &recorder{}
	fs := &fakeStreamer{plans: []plan{{mode: "ok"}}}
	cs, err := mustNew(t, WithBreaker(set), WithObserver(rec)).StreamClient()(context.Background(), bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
	if err != nil {
		t.Fatal(err)
	}
	_ = cs.CloseSend()
	if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "1"}); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("SendMsg: %v", err)
	}
	if _, err := b.Allow(); err != nil {
		t.Errorf("probe slot still held after the stream ended on SendMsg's error: %v (attempt starts %d, ends %d)", err, rec.count(EventAttemptStart), rec.count(EventAttemptEnd))
	}
}
