package interceptor

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/hedge"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// The regressions of the review of hedging (2026-12-02), each failing on
// the code before its fix.

// With a fixed Delay, the queueing rule applies too.
func TestHedgeReviewFixedDelayQueueing(t *testing.T) {
	q := newQueueHarness(t, Hedging{Delay: time.Millisecond, Adaptive: hedge.Config{MinSamples: 10}})
	calls, clk := func(n int, d time.Duration) { q.calls(t, n, d) }, q.clk
	calls(10, 2*time.Millisecond)
	clk.Advance(hedge.DefaultWindow / 20)
	calls(1, 2*time.Millisecond) // the median and its floor computed: 2 ms
	clk.Advance(hedge.DefaultWindow)
	calls(10, 40*time.Millisecond)
	clk.Advance(hedge.DefaultWindow / 20)
	q.reads.Store(0)
	leadAlone(t, q.i, q.f, q.timers)
}

// lastRefusal returns the Reason of the last EventHedgeRefused.
func lastRefusal(rec *eventWaiter) StopReason {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var r StopReason
	for _, e := range rec.ev {
		if e.Kind == EventHedgeRefused {
			r = e.Reason
		}
	}
	return r
}

// A caller that left before the hedge delay gets no hedge: no budget
// spent, nothing sent, nothing won.
func TestHedgeReviewNoHedgeAfterCallerLeft(t *testing.T) {
	timers, rec := newHedgeTimers(), newEventWaiter()
	lim := &countingLimiter{}
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), lim.option(), WithObserver(rec), timers.option())
	f := newHedgeInvoker()
	release := make(chan struct{})
	f.answer[0] = func(ctx context.Context, _ *testsvcv1.UnaryResponse, _ []grpc.CallOption) error {
		<-release // slow to notice the cancel
		return ctx.Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cc := newCC(t)
	go func() {
		var reply testsvcv1.UnaryResponse
		done <- i.UnaryClient()(ctx, "/svc/Get", &testsvcv1.UnaryRequest{}, &reply, cc, f.invoke)
	}()
	f.waitStarted(t, 0)
	cancel()
	timers.fire(t)
	rec.wait(t, EventHedgeRefused)
	close(release)
	waitErr(t, done)
	if rec.count(EventHedgeSent) != 0 || lim.tries.Load() != 0 || lastRefusal(rec) != StopCanceled {
		t.Errorf("hedges sent %d, retries asked %d, refused for %v; want 0, 0, %v", rec.count(EventHedgeSent), lim.tries.Load(), lastRefusal(rec), StopCanceled)
	}
}

// gRFC A6: a hedge that fails with a retried code (no pushback) sends the
// next hedge at once, not after another delay.
func TestHedgeReviewNonFatalSendsNextAtOnce(t *testing.T) {
	timers := newHedgeTimers()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Hour, MaxHedges: 2}), WithMaxAttempts(5), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = hang
	f.answer[1] = failWith(errUnavailable)
	f.answer[2] = answerID("second hedge")
	var reply testsvcv1.UnaryResponse
	done := hedgedCall(t, i, f, &reply)
	f.waitStarted(t, 0)
	timers.fire(t) // the lead's delay: the first hedge
	f.waitStarted(t, 1)
	f.waitStarted(t, 2) // no wait fired: at once
	if err := waitErr(t, done); err != nil || reply.GetId() != "second hedge" {
		t.Fatalf("call: %v, %q", err, reply.GetId())
	}
}

type panicOnHedgeSent struct {
	recorder
	once sync.Once
}

func (p *panicOnHedgeSent) Observe(ctx context.Context, e Event) {
	p.recorder.Observe(ctx, e)
	if e.Kind == EventHedgeSent {
		p.once.Do(func() { panic("observer boom") })
	}
}

// A panic of the coordinator (here the observer's) still reports every
// attempt to the mechanisms: a half-open probe must not keep its slot.
func TestHedgeReviewCoordinatorPanicReportsAttempts(t *testing.T) {
	timers, rec := newHedgeTimers(), &panicOnHedgeSent{}
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), WithObserver(rec), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = hang
	f.answer[1] = hang
	ctx, cc := ctxTimeout(t, time.Minute), newCC(t)
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		var reply testsvcv1.UnaryResponse
		_ = i.UnaryClient()(ctx, "/svc/Get", &testsvcv1.UnaryRequest{}, &reply, cc, f.invoke)
	}()
	f.waitStarted(t, 0)
	timers.fire(t)
	if v := <-done; v != "observer boom" {
		t.Fatalf("recovered %v, want the observer's panic", v)
	}
	if starts, ends := rec.count(EventAttemptStart), rec.count(EventAttemptEnd); starts != 2 || ends != 2 {
		t.Errorf("%d attempts started, %d reported ended; want 2 and 2", starts, ends)
	}
}

type blockOnEnd struct {
	eventWaiter
	attempt int
	entered chan struct{}
	release chan struct{}
}

func (b *blockOnEnd) Observe(ctx context.Context, e Event) {
	b.eventWaiter.Observe(ctx, e)
	if e.Kind == EventAttemptEnd && e.Attempt == b.attempt {
		close(b.entered)
		<-b.release
	}
}

// A hedge delay that passed while the coordinator handled a pushback
// does not send the next hedge: the pushback is waited in full.
func TestHedgeReviewTickDuringPushback(t *testing.T) {
	timers := newHedgeTimers()
	rec := &blockOnEnd{eventWaiter: *newEventWaiter(), attempt: 1, entered: make(chan struct{}), release: make(chan struct{})}
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond, MaxHedges: 3}), WithMaxAttempts(5), WithObserver(rec), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = hang
	f.answer[1] = trailered(metadata.Pairs(MetadataPushback, "300000"), "", errUnavailable)
	f.answer[2] = answerID("second hedge")
	var reply testsvcv1.UnaryResponse
	done := hedgedCall(t, i, f, &reply)
	f.waitStarted(t, 0)
	timers.fire(t) // the lead's delay: hedge 1, and the wait for hedge 2
	f.waitStarted(t, 1)
	tick := <-timers.started
	<-rec.entered // the coordinator is judging hedge 1's pushback answer
	tick()        // the hedge delay passes meanwhile
	close(rec.release)
	pushback := <-timers.started // the wait of the pushback replaces it
	select {
	case n := <-f.started:
		t.Fatalf("attempt %d went out before the pushback's wait", n)
	case <-time.After(100 * time.Millisecond): // an absence: nothing to wait on
	}
	go pushback()
	f.waitStarted(t, 2)
	if err := waitErr(t, done); err != nil || reply.GetId() != "second hedge" {
		t.Fatalf("call: %v, %q", err, reply.GetId())
	}
}

// The rules are asked again when the delay has passed: hedges that lost
// meanwhile stop the hedge due (StopHedgesLost).
func TestHedgeRulesAskedAgainWhenDue(t *testing.T) {
	timers, rec := newHedgeTimers(), newEventWaiter()
	still := time.Now()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), WithObserver(rec), timers.option(), withNow(func() time.Time { return still }))
	f := newHedgeInvoker()
	release := make(chan struct{})
	f.answer[0] = answerAfter(release, "first")
	var reply testsvcv1.UnaryResponse
	done := hedgedCall(t, i, f, &reply)
	f.waitStarted(t, 0) // the lead is out, with its timer
	ht := i.client.cfg.delays.get(normalizeTarget("passthrough:///payment"), "/svc/Get")
	for range 2 * winTrial { // other calls' hedges lost meanwhile
		ht.count(still, false)
	}
	timers.fire(t)
	rec.wait(t, EventHedgeRefused)
	close(release)
	if err := waitErr(t, done); err != nil || reply.GetId() != "first" {
		t.Fatalf("call: %v, %q", err, reply.GetId())
	}
	if got := lastRefusal(rec); got != StopHedgesLost {
		t.Errorf("refused for %v, want %v", got, StopHedgesLost)
	}
}

// A target that keeps the state of maxDelaysPerTarget methods already
// hedges no further method, and calls to it are plain calls (before: a
// nil state, and a panic).
func TestHedgePastMaxMethods(t *testing.T) {
	timers := newHedgeTimers()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = answerID("x")
	cc := newCC(t)
	for n := range maxDelaysPerTarget + 1 {
		var reply testsvcv1.UnaryResponse
		method := "/svc/M" + strconv.Itoa(n)
		if err := i.UnaryClient()(ctxTimeout(t, time.Minute), method, &testsvcv1.UnaryRequest{}, &reply, cc, f.invoke); err != nil {
			t.Fatalf("call %d: %v", n, err)
		}
		<-f.started
		select {
		case <-timers.started:
			if n == maxDelaysPerTarget {
				t.Fatal("the method past the bound started a hedge timer")
			}
		default:
			if n < maxDelaysPerTarget {
				t.Fatalf("method %d started no hedge timer", n)
			}
		}
	}
}

// An attempt whose error panics in GRPCStatus (the classification
// panics), the lead alone (no coordinator): reported as panicked, as the
// plain call's are (TestUnaryReportsEveryAttemptOnce), so that no
// mechanism keeps a slot for it.
func TestHedgeClassifyPanicLeadAlone(t *testing.T) {
	m := &countMech{}
	timers := newHedgeTimers()
	i := withMech(t, m, WithHedging(Hedging{Delay: time.Hour}), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = failWith(panicStatusErr{})
	_, p := recovering(func() error {
		var reply testsvcv1.UnaryResponse
		return i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/Get", &testsvcv1.UnaryRequest{}, &reply, newCC(t), f.invoke)
	})
	if !p {
		t.Fatal("no panic")
	}
	if m.allowed != 1 || m.dones != 1 {
		t.Fatalf("allowed %d, reported %d: want 1 and 1 (a half-open probe keeps its slot)", m.allowed, m.dones)
	}
}

// The same, for a hedge judged by the coordinator.
func TestHedgeClassifyPanicHedge(t *testing.T) {
	m := &countMech{}
	timers := newHedgeTimers()
	i := withMech(t, m, WithHedging(Hedging{Delay: time.Millisecond}), timers.option())
	f := newHedgeInvoker()
	f.answer[0] = hang
	f.answer[1] = failWith(panicStatusErr{})
	done := make(chan bool, 1)
	go func() {
		_, p := recovering(func() error {
			var reply testsvcv1.UnaryResponse
			return i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/Get", &testsvcv1.UnaryRequest{}, &reply, newCC(t), f.invoke)
		})
		done <- p
	}()
	f.waitStarted(t, 0)
	timers.fire(t)
	if !<-done {
		t.Fatal("no panic")
	}
	if m.allowed != 2 || m.dones != 2 {
		t.Fatalf("allowed %d, reported %d: want 2 and 2", m.allowed, m.dones)
	}
}

// lateStopper is a wait whose Stop comes too late, as time.Timer.Stop
// does once the timer expired and its function was started on its own
// goroutine (which may not have run yet).
type lateStopper struct{}

func (lateStopper) Stop() bool { return false }

// The hedge delay's timer expired (its function started, not yet run) as
// a hedge's positive pushback replaced the wait: the stale function's
// tick, sent late, must not reach the coordinator, or the next hedge
// goes at once instead of after the pushback.
func TestHedgeStaleTickAfterPushback(t *testing.T) {
	var waits []func()
	cfg := defaultConfig()
	cfg.afterFunc = func(_ time.Duration, f func()) stopper {
		waits = append(waits, f)
		return lateStopper{}
	}
	h := &hedgeCall{c: &call{cfg: &cfg}}
	h.startTick(time.Millisecond) // the hedge delay
	h.startTick(5 * time.Minute)  // a pushback replaces it, too late to stop it
	waits[0]()                    // the expired wait's function runs late
	select {
	case <-h.tick:
		t.Fatal("the replaced wait's late tick reached the coordinator")
	default:
	}
	waits[1]()
	select {
	case <-h.tick:
	default:
		t.Fatal("the pushback's wait did not tick")
	}
	h.stopTick()
	if h.tick != nil {
		t.Error("a stopped wait left a channel to tick on")
	}
}

// Header options passed as pointers (as this package passes its own to
// the invoker) are the caller's too: a winning hedge's header reaches
// them, not a loser's.
func TestHedgePointerHeaderOption(t *testing.T) {
	timers := newHedgeTimers()
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond}), timers.option())
	f := newHedgeInvoker()
	setHeader := func(who string) func(opts []grpc.CallOption) {
		return func(opts []grpc.CallOption) {
			for _, o := range opts {
				switch o := o.(type) {
				case grpc.HeaderCallOption:
					*o.HeaderAddr = metadata.Pairs("who", who)
				case *grpc.HeaderCallOption:
					*o.HeaderAddr = metadata.Pairs("who", who)
				}
			}
		}
	}
	f.answer[0] = func(ctx context.Context, _ *testsvcv1.UnaryResponse, opts []grpc.CallOption) error {
		err := hang(ctx, nil, nil)
		setHeader("lead")(opts) // headers had come; grpc fills the option at the end
		return err
	}
	f.answer[1] = func(_ context.Context, r *testsvcv1.UnaryResponse, opts []grpc.CallOption) error {
		setHeader("hedge")(opts)
		r.Id = "hedge"
		return nil
	}
	var reply testsvcv1.UnaryResponse
	var hd metadata.MD
	done := hedgedCall(t, i, f, &reply, &grpc.HeaderCallOption{HeaderAddr: &hd})
	f.waitStarted(t, 0)
	timers.fire(t)
	if err := waitErr(t, done); err != nil || reply.GetId() != "hedge" {
		t.Fatalf("call %v %q", err, reply.GetId())
	}
	if got := hd.Get("who"); len(got) != 1 || got[0] != "hedge" {
		t.Errorf("caller header who=%v, want the winning hedge", got)
	}
}

// A lead that the rules gave no timer (the target is queueing) and that
// outlasted its hedge delay reports the hedge refused, with the rule: a
// user's trial saw hedges stop for 16 s after a healthy slowdown read
// as queueing, and no event said why.
func TestHedgeRefusedByRulesReported(t *testing.T) {
	q := newQueueHarness(t, Hedging{Delay: time.Millisecond, Adaptive: hedge.Config{MinSamples: 10}})
	calls, clk := func(n int, d time.Duration) { q.calls(t, n, d) }, q.clk
	calls(11, 2*time.Millisecond)
	clk.Advance(hedge.DefaultWindow)
	calls(10, 40*time.Millisecond)
	clk.Advance(hedge.DefaultWindow / 20)
	q.reads.Store(0)
	before := q.rec.count(EventHedgeRefused)
	leadAlone(t, q.i, q.f, q.timers) // 40 ms: past the 1 ms delay
	if got := q.rec.count(EventHedgeRefused) - before; got != 1 || lastRefusal(q.rec) != StopQueueing {
		t.Errorf("hedges refused: %d, last for %v; want 1, %v", got, lastRefusal(q.rec), StopQueueing)
	}
}
