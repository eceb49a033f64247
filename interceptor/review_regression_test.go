package interceptor

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Regression tests for what review found after the merge of the client
// correctness, adaptive throttle and admission work.

// gatedStream holds its first SendMsg (the replay into a new attempt)
// until gate closes, and says so on entered.
type gatedStream struct {
	*fakeStream
	entered chan struct{}
	gate    chan struct{}
	once    sync.Once
}

func (g *gatedStream) SendMsg(m any) error {
	g.once.Do(func() { close(g.entered) })
	<-g.gate
	return g.fakeStream.SendMsg(m)
}

// Context called while a retry replays into its new attempt commits the
// stream: the new attempt must not be installed after that (it would be a
// retry after the commit, behind a context that is already cancelled).
// Before the fix RecvMsg delivered a message from attempt 2 while the
// context Context() had returned was cancelled.
func TestContextDuringReplayCommits(t *testing.T) {
	ctx := ctxTimeout(t, 10*time.Second)
	entered, gate := make(chan struct{}), make(chan struct{})
	n := 0
	streamer := func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		n++
		if n == 1 {
			return newFakeStream(ctx, plan{mode: "before", at: 1}), nil
		}
		return &gatedStream{fakeStream: newFakeStream(ctx, plan{mode: "ok"}), entered: entered, gate: gate}, nil
	}
	cs, err := mustNew(t, noWait).StreamClient()(ctx, bidiDesc, newCC(t), "/svc/Bidi", streamer)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"}); err != nil {
		t.Fatal(err)
	}
	recvd := make(chan error, 1)
	go func() { recvd <- cs.RecvMsg(&testsvcv1.BidiResponse{}) }()
	<-entered // the retry is replaying into attempt 2
	cctx := cs.Context()
	close(gate)
	err = <-recvd
	if err == nil {
		t.Fatalf("RecvMsg delivered from attempt 2 after Context() committed the stream (its context: %v)", cctx.Err())
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want the first attempt's Unavailable", err)
	}
}

// downThrottle returns a set whose throttle for the test connection's
// target is down after healthy traffic.
func downThrottle(t *testing.T, clk *clock.Fake, cc *grpc.ClientConn) (*adaptive.Set, *adaptive.Throttle) {
	t.Helper()
	set := newAdaptive(t, clk, nil)
	th := set.Get(normalizeTarget(cc.Target()))
	p, _ := th.Allow(false)
	p.Done(adaptive.Accept)
	clk.Advance(time.Second)
	for range 10 {
		p, _ = th.Allow(false)
		p.Done(adaptive.Overload)
	}
	if !th.Down() {
		t.Fatalf("throttle not down: %+v", th.Stats())
	}
	return set, th
}

// A probe stream that the target answers revives a down throttle at its
// first message, not when the stream ends (a watch stream may never end).
// Before the fix the throttle stayed down.
func TestAdaptiveProbeStreamAnswered(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cc := newCC(t)
	set, th := downThrottle(t, clk, cc)
	i := mustNew(t, WithAdaptive(set))
	fs := &fakeStreamer{plans: []plan{{mode: "ok"}}}
	ctx := ctxTimeout(t, 10*time.Second)
	var cs grpc.ClientStream
	for n := 0; cs == nil && n < 100; n++ {
		clk.Advance(10 * time.Millisecond)
		cs, _ = i.StreamClient()(ctx, bidiDesc, cc, "/svc/Bidi", fs.streamer)
	}
	if cs == nil {
		t.Fatal("no probe stream in 100 tries")
	}
	if err := cs.SendMsg(&testsvcv1.BidiRequest{Id: "0"}); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(&testsvcv1.BidiResponse{}); err != nil {
		t.Fatal(err)
	}
	if th.Down() {
		t.Fatalf("the probe stream was answered, the throttle is still down: %+v", th.Stats())
	}
}

// A call the throttle refuses before any attempt says so, not "circuit
// breaker open" (there may be no breaker at all).
func TestThrottledMessage(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cc := newCC(t)
	set, _ := downThrottle(t, clk, cc)
	i := mustNew(t, WithAdaptive(set))
	f := &fakeInvoker{results: []error{nil}}
	var err error
	for n := 0; n < 100 && len(f.seen) == 0; n++ {
		if err = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke); err != nil {
			break
		}
	}
	if got := status.Convert(err); got.Code() != codes.Unavailable || got.Message() != ThrottledMessage {
		t.Fatalf("refused call: got %v, want Unavailable %q", err, ThrottledMessage)
	}
}
