package interceptor

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// (From the review of the session's range, 2026-12-05.) A bidi stream got headers, then its target died (the attempt ended
// UNAVAILABLE). Meanwhile the throttle marked the target down. The
// client only sends: its next SendMsg meets io.EOF, reads the headers
// that came before the crash, and "answers" the throttle: the dead
// target is revived (and reported up). RecvMsg's own path (failed) reads
// the same headers and deliberately does not call answered.
func TestStreamSendEOFKeepsDeadTargetDown(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var reports []bool
	set, err := adaptive.NewSet(adaptive.Config{Clock: clk, Rand: func() float64 { return 0.5 }, Hold: -1,
		OnDown: func(_ string, down bool) { reports = append(reports, down) }}, 0)
	if err != nil {
		t.Fatal(err)
	}
	i := mustNew(t, WithAdaptive(set), WithMaxAttempts(1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fs := &fakeStreamer{plans: []plan{{mode: "hdrfail", at: 1}}}
	cs, err := i.StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", fs.streamer)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"}); err != nil {
		t.Fatal(err)
	}
	fs.mu.Lock()
	first := fs.attempts[0]
	fs.mu.Unlock()
	_, _ = first.Header() // the fake has sent headers and ended (the crash)

	// Other calls find the target dead: its channel broke, a failure.
	th := set.Get(normalizeTarget(newCC(t).Target()))
	markDown(t, th, clk)

	if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "1"}); !errors.Is(err, io.EOF) {
		t.Fatalf("send: %v, want io.EOF", err)
	}
	if !th.Down() {
		t.Fatalf("a dead target revived by headers of a stream that then failed; reports %v", reports)
	}
}
