package interceptor

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/hedge"
	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// hedgeTimers replaces the waits of hedged calls: each wait started is
// sent on started, and fires when the test calls fire.
type hedgeTimers struct {
	started chan func()
	mu      sync.Mutex
	delays  []time.Duration // of every wait started
}

func newHedgeTimers() *hedgeTimers { return &hedgeTimers{started: make(chan func(), 16)} }

func (h *hedgeTimers) option() Option {
	return Option{apply: func(c *config) error {
		c.afterFunc = func(d time.Duration, f func()) stopper {
			h.mu.Lock()
			h.delays = append(h.delays, d)
			h.mu.Unlock()
			h.started <- f
			return fakeStopper{}
		}
		return nil
	}}
}

type fakeStopper struct{}

func (fakeStopper) Stop() bool { return true }

// fire runs the next wait the call started, on a goroutine of its own,
// as time.AfterFunc does.
func (h *hedgeTimers) fire(t *testing.T) {
	t.Helper()
	select {
	case f := <-h.started:
		go f()
	case <-time.After(10 * time.Second):
		t.Fatal("the call started no wait")
	}
}

// hedgeInvoker is a fake invoker whose attempt i (read from the attempt
// metadata) runs answer[i]; every attempt's metadata and context are kept.
type hedgeInvoker struct {
	mu      sync.Mutex
	md      map[int]metadata.MD
	ctxErr  map[int]error
	started chan int
	answer  map[int]func(ctx context.Context, reply *testsvcv1.UnaryResponse, opts []grpc.CallOption) error
}

func newHedgeInvoker() *hedgeInvoker {
	return &hedgeInvoker{md: map[int]metadata.MD{}, ctxErr: map[int]error{}, started: make(chan int, 16),
		answer: map[int]func(context.Context, *testsvcv1.UnaryResponse, []grpc.CallOption) error{}}
}

// hang waits for the attempt's context to end.
func hang(ctx context.Context, _ *testsvcv1.UnaryResponse, _ []grpc.CallOption) error {
	<-ctx.Done()
	return status.FromContextError(ctx.Err()).Err()
}

// answerID answers with id.
func answerID(id string) func(context.Context, *testsvcv1.UnaryResponse, []grpc.CallOption) error {
	return func(_ context.Context, r *testsvcv1.UnaryResponse, _ []grpc.CallOption) error {
		r.Id = id
		return nil
	}
}

// trailered answers with trailer md, and with id or err.
func trailered(md metadata.MD, id string, err error) func(context.Context, *testsvcv1.UnaryResponse, []grpc.CallOption) error {
	return func(_ context.Context, r *testsvcv1.UnaryResponse, opts []grpc.CallOption) error {
		for _, o := range opts {
			if to, ok := o.(grpc.TrailerCallOption); ok {
				*to.TrailerAddr = md
			}
		}
		r.Id = id
		return err
	}
}

// answerAfter answers with id once release is closed.
func answerAfter(release <-chan struct{}, id string) func(context.Context, *testsvcv1.UnaryResponse, []grpc.CallOption) error {
	return func(_ context.Context, r *testsvcv1.UnaryResponse, _ []grpc.CallOption) error {
		<-release
		r.Id = id
		return nil
	}
}

// refusedHedge runs a call whose lead waits for release while its hedge
// is due, checks that the hedge is refused and the lead answers.
func refusedHedge(t *testing.T, i *Interceptors, f *hedgeInvoker, timers *hedgeTimers, rec *eventWaiter) {
	t.Helper()
	release := make(chan struct{})
	f.answer[0] = answerAfter(release, "first")
	var reply testsvcv1.UnaryResponse
	done := hedgedCall(t, i, f, &reply)
	f.waitStarted(t, 0)
	timers.fire(t)
	rec.wait(t, EventHedgeRefused)
	close(release)
	if err := waitErr(t, done); err != nil || reply.GetId() != "first" {
		t.Fatalf("call: %v, reply %q; want the first attempt's", err, reply.GetId())
	}
}

// leadAlone runs a call whose lead answers, and checks that it started
// no hedge timer: the rules said no hedge before the lead went out.
func leadAlone(t *testing.T, i *Interceptors, f *hedgeInvoker, timers *hedgeTimers) {
	t.Helper()
	f.mu.Lock()
	f.answer[0] = answerID("first")
	f.mu.Unlock()
	var reply testsvcv1.UnaryResponse
	if err := waitErr(t, hedgedCall(t, i, f, &reply)); err != nil || reply.GetId() != "first" {
		t.Fatalf("call: %v, reply %q; want the first attempt's", err, reply.GetId())
	}
	<-f.started
	select {
	case <-timers.started:
		t.Fatal("the lead started a hedge timer")
	default:
	}
}

func failWith(err error) func(context.Context, *testsvcv1.UnaryResponse, []grpc.CallOption) error {
	return func(context.Context, *testsvcv1.UnaryResponse, []grpc.CallOption) error { return err }
}

func (f *hedgeInvoker) invoke(ctx context.Context, _ string, _, reply any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
	md, _ := metadata.FromOutgoingContext(ctx)
	n := 0
	if v := md.Get(MetadataAttempt); len(v) > 0 {
		n, _ = strconv.Atoi(v[0])
	}
	f.mu.Lock()
	f.md[n] = md
	answer := f.answer[n]
	f.mu.Unlock()
	f.started <- n
	err := answer(ctx, reply.(*testsvcv1.UnaryResponse), opts)
	f.mu.Lock()
	f.ctxErr[n] = ctx.Err()
	f.mu.Unlock()
	return err
}

func (f *hedgeInvoker) waitStarted(t *testing.T, want int) {
	t.Helper()
	select {
	case n := <-f.started:
		if n != want {
			t.Fatalf("attempt %d started, want %d", n, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("attempt %d did not start", want)
	}
}

// hedgedCall runs one call of i's unary client through f, on its own
// goroutine; the call's error arrives on the channel.
func hedgedCall(t *testing.T, i *Interceptors, f *hedgeInvoker, reply *testsvcv1.UnaryResponse, opts ...grpc.CallOption) <-chan error {
	t.Helper()
	ctx := ctxTimeout(t, time.Minute)
	cc := newCC(t)
	done := make(chan error, 1)
	go func() {
		done <- i.UnaryClient()(ctx, "/svc/Get", &testsvcv1.UnaryRequest{}, reply, cc, f.invoke, opts...)
	}()
	return done
}

func waitErr(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not end")
		return nil
	}
}

// A hedge that answers first is the call's answer: its reply, its
// trailer; the first attempt is cancelled, and the events say so.
func TestHedgeFirstAnswerWins(t *testing.T) {
	timers, rec := newHedgeTimers(), &recorder{}
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), WithBudget(budget.Config{}), WithObserver(rec), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = hang
	f.answer[1] = trailered(metadata.Pairs("who", "hedge"), "hedge", nil)
	var reply testsvcv1.UnaryResponse
	var trailer metadata.MD
	done := hedgedCall(t, i, f, &reply, grpc.Trailer(&trailer))
	f.waitStarted(t, 0)
	timers.fire(t)
	f.waitStarted(t, 1)
	if err := waitErr(t, done); err != nil {
		t.Fatalf("call: %v", err)
	}
	if reply.GetId() != "hedge" {
		t.Errorf("reply %q, want the hedge's", reply.GetId())
	}
	if got := trailer.Get("who"); len(got) != 1 || got[0] != "hedge" {
		t.Errorf("caller's trailer %v, want the hedge's", trailer)
	}
	if !errors.Is(f.ctxErr[0], context.Canceled) {
		t.Errorf("first attempt's context: %v, want cancelled", f.ctxErr[0])
	}
	if got := f.md[0].Get(MetadataHedging); len(got) != 1 || got[0] != "1" {
		t.Errorf("first attempt's %s %v, want [1]", MetadataHedging, got)
	}
	if got := f.md[1].Get(MetadataHedging); len(got) != 1 || got[0] != "2" {
		t.Errorf("hedge's %s %v, want [2]", MetadataHedging, got)
	}
	for k, want := range map[EventKind]int{EventHedgeSent: 1, EventHedgeWon: 1, EventHedgeCancelled: 1, EventAttemptStart: 2, EventAttemptEnd: 2} {
		if got := rec.count(k); got != want {
			t.Errorf("%v events: %d, want %d", k, got, want)
		}
	}
}

// An answer before the delay: no hedge, and the wait is stopped.
func TestHedgeNotNeeded(t *testing.T) {
	timers := newHedgeTimers()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = answerID("first")
	var reply testsvcv1.UnaryResponse
	if err := waitErr(t, hedgedCall(t, i, f, &reply)); err != nil {
		t.Fatal(err)
	}
	if reply.GetId() != "first" || len(f.md) != 1 {
		t.Errorf("reply %q after %d attempts, want the first's after 1", reply.GetId(), len(f.md))
	}
}

// gRFC A6: the first attempt to answer with a code that is not retried
// ends the call, and the others are cancelled.
func TestHedgeFatalCodeEndsCall(t *testing.T) {
	timers := newHedgeTimers()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = hang
	f.answer[1] = failWith(errInternal)
	var reply testsvcv1.UnaryResponse
	done := hedgedCall(t, i, f, &reply)
	f.waitStarted(t, 0)
	timers.fire(t)
	err := waitErr(t, done)
	if status.Code(err) != codes.Internal {
		t.Fatalf("call: %v, want the hedge's Internal", err)
	}
	if !errors.Is(f.ctxErr[0], context.Canceled) {
		t.Errorf("first attempt's context: %v, want cancelled", f.ctxErr[0])
	}
}

// gRFC A6: an attempt that failed with a retried code leaves the other in
// flight to answer.
func TestHedgeRetriedCodeWaitsForTheOther(t *testing.T) {
	timers := newHedgeTimers()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), timers.option())
	f := newHedgeInvoker()
	release := make(chan struct{})
	f.answer[0] = answerAfter(release, "first")
	f.answer[1] = failWith(errUnavailable)
	var reply testsvcv1.UnaryResponse
	done := hedgedCall(t, i, f, &reply)
	f.waitStarted(t, 0)
	timers.fire(t)
	f.waitStarted(t, 1)
	close(release)
	if err := waitErr(t, done); err != nil {
		t.Fatalf("call: %v, want the first attempt's success", err)
	}
	if reply.GetId() != "first" {
		t.Errorf("reply %q, want the first's", reply.GetId())
	}
}

// gRFC A6: an attempt that arrived with response headers committed the
// call: its failure, even with a retried code, is the call's.
func TestHedgeCommitEndsCall(t *testing.T) {
	timers := newHedgeTimers()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = hang
	f.answer[1] = func(_ context.Context, _ *testsvcv1.UnaryResponse, opts []grpc.CallOption) error {
		for _, o := range opts {
			if ho, ok := o.(grpc.HeaderCallOption); ok {
				*ho.HeaderAddr = metadata.MD{}
			}
		}
		return errUnavailable
	}
	var reply testsvcv1.UnaryResponse
	done := hedgedCall(t, i, f, &reply)
	f.waitStarted(t, 0)
	timers.fire(t)
	err := waitErr(t, done)
	var se *Error
	if status.Code(err) != codes.Unavailable || !errors.As(err, &se) || se.Reason != StopCommitted {
		t.Fatalf("call: %v, want the hedge's Unavailable, stopped as committed", err)
	}
	if !errors.Is(f.ctxErr[0], context.Canceled) {
		t.Errorf("first attempt's context: %v, want cancelled", f.ctxErr[0])
	}
}

// "Do not retry" stops the hedges: no hedge after it, no retry after the
// last attempt fails.
func TestHedgePushbackStopsHedges(t *testing.T) {
	timers, rec := newHedgeTimers(), newEventWaiter()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond, MaxHedges: 2}), WithMaxAttempts(5), WithObserver(rec), timers.option())
	f := newHedgeInvoker()
	release := make(chan struct{})
	f.answer[0] = func(ctx context.Context, _ *testsvcv1.UnaryResponse, _ []grpc.CallOption) error {
		<-release
		return errUnavailable
	}
	f.answer[1] = trailered(metadata.Pairs(MetadataPushback, "-1"), "", errUnavailable)
	var reply testsvcv1.UnaryResponse
	done := hedgedCall(t, i, f, &reply)
	f.waitStarted(t, 0)
	timers.fire(t) // the first hedge
	f.waitStarted(t, 1)
	rec.wait(t, EventAttemptEnd) // the hedge's "do not retry"
	timers.fire(t)               // the second hedge's time
	close(release)
	err := waitErr(t, done)
	var se *Error
	if !errors.As(err, &se) || se.Reason != StopPushback {
		t.Fatalf("call: %v, want stopped by pushback", err)
	}
	if len(f.md) != 2 {
		t.Errorf("%d attempts, want 2", len(f.md))
	}
}

// A hedge spends the retry budget: with none left, the hedge is refused
// and the first attempt still answers.
func TestHedgeSpendsBudget(t *testing.T) {
	timers, rec := newHedgeTimers(), newEventWaiter()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), WithLimiter(func() budget.Limiter { return refuseAll{} }), WithObserver(rec), timers.option())
	f := newHedgeInvoker()
	refusedHedge(t, i, f, timers, rec)
	if len(f.md) != 1 || rec.count(EventHedgeSent) != 0 {
		t.Errorf("%d attempts, %d hedges sent; want 1 and 0", len(f.md), rec.count(EventHedgeSent))
	}
}

// eventWaiter is an Observer that lets a test wait for an event.
type eventWaiter struct {
	recorder
	ch chan EventKind
}

func newEventWaiter() *eventWaiter { return &eventWaiter{ch: make(chan EventKind, 4096)} }

func (w *eventWaiter) Observe(ctx context.Context, e Event) {
	w.recorder.Observe(ctx, e)
	w.ch <- e.Kind
}

// wait returns once an event of kind k came.
func (w *eventWaiter) wait(t *testing.T, k EventKind) {
	t.Helper()
	for {
		select {
		case got := <-w.ch:
			if got == k {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %v event", k)
		}
	}
}

// refuseAll is a retry limiter that refuses every retry.
type refuseAll struct{}

func (refuseAll) RecordRequest()            {}
func (refuseAll) RecordOutcome(bool)        {}
func (refuseAll) TryRetry() bool            { return false }
func (refuseAll) Snapshot() budget.Snapshot { return budget.Snapshot{} }

// A tier whose request a tier above hedges does not hedge its own calls
// (it passes the mark on), and a call that serves a hedge marks its
// attempts as serving one; a tier policy that allows one attempt hedges
// nothing either.
func TestHedgeOnlyOneTier(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   Info
		want string // MetadataHedging sent
	}{
		{"a tier above hedges", Info{Depth: 1, Hedged: true}, "1"},
		{"serving a hedge", Info{Depth: 1, Attempt: 1, UpstreamRetries: 1, Hedged: true, Hedge: true}, "2"},
		// One attempt allowed: no hedge, no mark; the tiers below allow
		// one attempt too.
		{"a tier above retries", Info{Depth: 1, Attempt: 1, UpstreamRetries: 1}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			timers := newHedgeTimers()
			i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), timers.option())
			f := newHedgeInvoker()
			f.answer[0] = answerID("only")
			sc := &stateCtx{Context: ctxTimeout(t, time.Minute)}
			sc.st.info = tt.in
			var reply testsvcv1.UnaryResponse
			if err := i.UnaryClient()(sc, "/svc/Get", &testsvcv1.UnaryRequest{}, &reply, newCC(t), f.invoke); err != nil {
				t.Fatal(err)
			}
			select {
			case <-timers.started:
				t.Error("the call started a hedge's wait")
			default:
			}
			if got := strings.Join(f.md[0].Get(MetadataHedging), ","); got != tt.want {
				t.Errorf("%s %q, want %q", MetadataHedging, got, tt.want)
			}
		})
	}
}

// A panic in a hedge's invoker (an interceptor further in) is raised on
// the caller's goroutine, once the other attempts returned, where a
// recovery interceptor further out sees it.
func TestHedgePanicReachesCaller(t *testing.T) {
	timers := newHedgeTimers()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), WithBudget(budget.Config{}), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = hang
	f.answer[1] = func(context.Context, *testsvcv1.UnaryResponse, []grpc.CallOption) error { panic("hedge boom") }
	done := make(chan any, 1)
	ctx, cc := ctxTimeout(t, time.Minute), newCC(t)
	go func() {
		defer func() { done <- recover() }()
		var reply testsvcv1.UnaryResponse
		_ = i.UnaryClient()(ctx, "/svc/Get", &testsvcv1.UnaryRequest{}, &reply, cc, f.invoke)
	}()
	f.waitStarted(t, 0)
	timers.fire(t)
	select {
	case v := <-done:
		if v != "hedge boom" {
			t.Fatalf("recovered %v, want the hedge's panic", v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not end")
	}
	if !errors.Is(f.ctxErr[0], context.Canceled) {
		t.Errorf("first attempt's context: %v, want cancelled", f.ctxErr[0])
	}
}

// The adaptive delay starts at Adaptive.Initial and, once MinSamples
// first attempts answered, is their percentile.
func TestHedgeAdaptiveDelay(t *testing.T) {
	var delays []time.Duration
	timer := Option{apply: func(c *config) error {
		c.afterFunc = func(d time.Duration, _ func()) stopper {
			delays = append(delays, d)
			return fakeStopper{}
		}
		return nil
	}}
	// Every attempt takes 5 ms on the interceptor's clock.
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	reads := 0
	now := withNow(func() time.Time {
		n := reads // two reads per call: its start, its end
		reads++
		return base.Add(time.Duration(n/2) * time.Second).Add(time.Duration(n%2) * 5 * time.Millisecond)
	})
	clk := clock.NewFake(base) // the delay's, which it recomputes every Window/20
	i := mustNew(t, WithHedging(Hedging{Adaptive: hedge.Config{MinSamples: 10, Initial: 7 * time.Millisecond, Clock: clk}}), timer, now)
	f := newHedgeInvoker()
	f.answer[0] = answerID("x")
	cc := newCC(t)
	for n := range 11 {
		if n == 10 {
			clk.Advance(time.Second)
		}
		var reply testsvcv1.UnaryResponse
		if err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/Get", &testsvcv1.UnaryRequest{}, &reply, cc, f.invoke); err != nil {
			t.Fatal(err)
		}
		<-f.started
	}
	if len(delays) != 11 || delays[0] != 7*time.Millisecond {
		t.Fatalf("delays %v, want 11 starting at Initial (7ms)", delays)
	}
	if d := delays[10]; d < 5*time.Millisecond || d > 5500*time.Microsecond {
		t.Errorf("delay after 10 latencies of 5 ms: %v, want their percentile (5 ms, to the bucket)", d)
	}
}

// The win rule: hedges go out while at least one in ten of the recent
// ones won, or while fewer than ten were sent lately; hedges that keep
// losing (a target where every request waits in one queue) stop, and
// hedging tries again once the losses have aged.
func TestHedgeWinRule(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ht := &hedgeTarget{}
	winning := func(at time.Time) bool { return ht.allows(at, false) != StopHedgesLost }
	for n := range winTrial {
		if !winning(now) {
			t.Fatalf("refused after %d hedges: want %d tried first", n, winTrial)
		}
		ht.count(now, false)
	}
	if winning(now) {
		t.Fatalf("%d hedges sent, none won: still hedging", winTrial)
	}
	ht.count(now, true)
	if !winning(now) {
		t.Fatalf("1 of %d won: want hedging (>= %v)", winTrial, minWinShare)
	}
	for range 20 {
		ht.count(now, false)
	}
	if winning(now) {
		t.Fatal("1 of 30 won: still hedging")
	}
	if !winning(now.Add(4 * winHalfLife)) {
		t.Fatal("after four half-lives: want a trial")
	}
}

// The share rule: however slow the target turns, recent hedges stay
// below share of its recent calls, plus one, so that a delay learnt from
// faster times does not hedge a growing queue's every call.
func TestHedgeShareRule(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ht := &hedgeTarget{share: 0.05}
	hedges := 0
	for range 4000 { // 4 s of 1 000 calls a second, every one outlasting the delay
		if ht.allows(now, true) == 0 {
			hedges++
			ht.count(now, false)
			ht.count(now, true) // and winning: only the share rule stops them
		}
		now = now.Add(time.Millisecond)
	}
	if hedges < 150 || hedges > 230 {
		t.Errorf("%d hedges for 4 000 calls that all outlasted the delay, want about 5 %% (200)", hedges)
	}
	if r := ht.allows(now, false); r != StopHedgeShare {
		t.Errorf("at the share: %v, want %v", r, StopHedgeShare)
	}
	// A quiet client still hedges now and then.
	quiet := &hedgeTarget{share: 0.05}
	if r := quiet.allows(now, true); r != 0 {
		t.Errorf("first call of a quiet client: %v, want a hedge allowed", r)
	}
}

// Through the call: a target whose hedges lose gets no more after
// winTrial of them, and the refusal says why. (The clock stands still:
// the losses do not age.)
func TestHedgesThatLoseStop(t *testing.T) {
	timers, rec := newHedgeTimers(), newEventWaiter()
	still := time.Now()
	// Every call hedged: their share (1 - Percentile) allows it.
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond, Adaptive: hedge.Config{Percentile: 0.01}}), WithObserver(rec), timers.option(), withNow(func() time.Time { return still }))
	f := newHedgeInvoker()
	f.answer[1] = hang // the hedge waits behind the first: it never wins
	for n := range winTrial {
		release := make(chan struct{})
		var reply testsvcv1.UnaryResponse
		done := hedgeSent(t, i, f, timers, answerAfter(release, "first"), &reply)
		close(release)
		if err := waitErr(t, done); err != nil || reply.GetId() != "first" {
			t.Fatalf("call %d: %v, %q; want the first attempt's answer", n, err, reply.GetId())
		}
	}
	leadAlone(t, i, f, timers) // the eleventh: no timer, no hedge
	if sent := rec.count(EventHedgeSent); sent != winTrial {
		t.Errorf("%d hedges sent, want %d", sent, winTrial)
	}
}

// A hedge's fresh reply is made without reading the caller's, which the
// lead attempt may be unmarshaling into at that moment (the race
// detector saw it in stormsim's tail scenario).
func TestHedgeReplyNotReadWhileLeadWrites(t *testing.T) {
	timers := newHedgeTimers()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = func(ctx context.Context, r *testsvcv1.UnaryResponse, _ []grpc.CallOption) error {
		for ctx.Err() == nil { // as a codec would: Reset, then fill in
			proto.Reset(r)
			r.Id = "lead"
		}
		return status.FromContextError(ctx.Err()).Err()
	}
	f.answer[1] = answerID("hedge")
	var reply testsvcv1.UnaryResponse
	done := hedgedCall(t, i, f, &reply)
	f.waitStarted(t, 0)
	timers.fire(t)
	if err := waitErr(t, done); err != nil || reply.GetId() != "hedge" {
		t.Fatalf("call: %v, reply %q; want the hedge's", err, reply.GetId())
	}
}

// gRFC A6: a positive pushback while another attempt is in flight delays
// the next hedge by the pushback.
func TestHedgePushbackDelaysNextHedge(t *testing.T) {
	timers, rec := newHedgeTimers(), newEventWaiter()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond, MaxHedges: 2}), WithMaxAttempts(5), WithObserver(rec), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = hang
	f.answer[1] = trailered(metadata.Pairs(MetadataPushback, "300"), "", errUnavailable)
	f.answer[2] = answerID("second hedge")
	var reply testsvcv1.UnaryResponse
	done := hedgedCall(t, i, f, &reply)
	f.waitStarted(t, 0)
	timers.fire(t) // the first hedge; it starts the wait for the second
	f.waitStarted(t, 1)
	rec.wait(t, EventAttemptEnd) // the first hedge's pushback
	<-timers.started             // the second hedge's first wait, replaced
	timers.fire(t)               // the wait of the pushback
	if err := waitErr(t, done); err != nil || reply.GetId() != "second hedge" {
		t.Fatalf("call: %v, %q; want the second hedge's answer", err, reply.GetId())
	}
	timers.mu.Lock()
	defer timers.mu.Unlock()
	if n := len(timers.delays); n != 3 || timers.delays[2] != 300*time.Millisecond {
		t.Errorf("waits %v, want the hedge delay twice, then the pushback (300ms)", timers.delays)
	}
}

// A target whose median latency rose to more than twice its lowest gets
// no hedges: it is queueing, and a hedge would wait in the same queue.
func TestHedgeNotIntoAQueue(t *testing.T) {
	q := newQueueHarness(t, Hedging{Adaptive: hedge.Config{MinSamples: 10}})
	calls, clk := func(n int, d time.Duration) { q.calls(t, n, d) }, q.clk
	calls(11, 2*time.Millisecond) // the 11th call's delay is the first computed
	clk.Advance(hedge.DefaultWindow)
	calls(10, 40*time.Millisecond)
	clk.Advance(hedge.DefaultWindow / 20)

	q.reads.Store(0)
	leadAlone(t, q.i, q.f, q.timers)
}

// queueHarness drives hedging calls whose latency the test sets, on an
// interceptor clock read twice per call (its start, its end) and a fake
// clock for the delay's window, for the tests of the queueing rule.
type queueHarness struct {
	i      *Interceptors
	f      *hedgeInvoker
	timers *hedgeTimers
	rec    *eventWaiter
	clk    *clock.Fake
	cc     *grpc.ClientConn
	reads  atomic.Int64
	lat    atomic.Int64 // each attempt's latency on the interceptor's clock
}

func newQueueHarness(t *testing.T, h Hedging) *queueHarness {
	q := &queueHarness{timers: newHedgeTimers(), rec: newEventWaiter(), f: newHedgeInvoker()}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := withNow(func() time.Time {
		n := q.reads.Add(1) - 1 // two reads per call: its start, its end
		return base.Add(time.Duration(n/2) * time.Second).Add(time.Duration(n%2) * time.Duration(q.lat.Load()))
	})
	q.clk = clock.NewFake(base)
	h.Adaptive.Clock = q.clk
	q.i = mustNew(t, WithHedging(h), WithObserver(q.rec), q.timers.option(), now)
	q.f.answer[0] = answerID("x")
	q.cc = newCC(t)
	return q
}

// calls makes n calls of latency d, each waiting for its lead and its
// hedge's timer (never due).
func (q *queueHarness) calls(t *testing.T, n int, d time.Duration) {
	t.Helper()
	q.lat.Store(int64(d))
	for range n {
		var reply testsvcv1.UnaryResponse
		if err := q.i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/Get", &testsvcv1.UnaryRequest{}, &reply, q.cc, q.f.invoke); err != nil {
			t.Fatal(err)
		}
		<-q.f.started
		<-q.timers.started
	}
}

// Through the call: with the clock standing still (nothing decays), the
// share rule lets the first two calls hedge (under 5 % of the calls, plus
// one) and then starts no hedge timer, however slow the leads are.
func TestHedgeShareThroughCalls(t *testing.T) {
	timers, rec := newHedgeTimers(), newEventWaiter()
	still := time.Now()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), WithObserver(rec), timers.option(), withNow(func() time.Time { return still }))
	f := newHedgeInvoker()
	f.answer[1] = answerID("hedge") // the hedge answers first: the win rule never stops it
	for n := range 2 {
		var reply testsvcv1.UnaryResponse
		done := hedgeSent(t, i, f, timers, hang, &reply) // the lead waits until the hedge's answer cancels it
		if err := waitErr(t, done); err != nil || reply.GetId() != "hedge" {
			t.Fatalf("call %d: %v, %q; want the hedge's answer", n, err, reply.GetId())
		}
	}
	leadAlone(t, i, f, timers) // the third: two hedges of three calls is past the share
	if sent := rec.count(EventHedgeSent); sent != 2 {
		t.Errorf("%d hedges sent, want 2", sent)
	}
}

// hedgeSent starts a call whose lead answers with lead, fires its hedge
// timer and waits until the hedge went out; the call's error arrives on
// the channel.
func hedgeSent(t *testing.T, i *Interceptors, f *hedgeInvoker, timers *hedgeTimers, lead func(context.Context, *testsvcv1.UnaryResponse, []grpc.CallOption) error, reply *testsvcv1.UnaryResponse) <-chan error {
	t.Helper()
	f.mu.Lock()
	f.answer[0] = lead
	f.mu.Unlock()
	done := hedgedCall(t, i, f, reply)
	f.waitStarted(t, 0)
	timers.fire(t)
	f.waitStarted(t, 1)
	return done
}
