package interceptor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// eventLog is an Observer per name that keeps one line per event.
type eventLog struct {
	mu    sync.Mutex
	lines []string
}

type named struct {
	log  *eventLog
	name string
}

func (n named) Observe(_ context.Context, e Event) {
	line := n.name + " " + e.Kind.String()
	switch e.Kind {
	case EventAttemptStart, EventRetryScheduled:
		line += fmt.Sprintf(" #%d", e.Attempt)
	case EventAttemptEnd:
		line += fmt.Sprintf(" #%d %v", e.Attempt, e.Code)
	case EventRetryRefused:
		line += " " + e.Reason.String()
	case EventRequestReceived:
		line += fmt.Sprintf(" depth=%d", e.Info.Depth)
	case EventPushbackSent:
		line += " " + e.Code.String()
	case EventBreakerStateChange:
		line += fmt.Sprintf(" %s %v->%v", e.Target, e.From, e.To)
	}
	n.log.mu.Lock()
	n.log.lines = append(n.log.lines, line)
	n.log.mu.Unlock()
}

func (l *eventLog) sorted() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := slices.Clone(l.lines)
	slices.Sort(s)
	return s
}

// TestObserverEvents: payment down, one request, every tier observed.
func TestObserverEvents(t *testing.T) {
	log := &eventLog{}
	hops := []string{"edge", "gateway", "order"}
	tiers := []string{"gateway", "order", "payment"}
	c := testsvc.New(t, testsvc.Config{
		DialOptions: func(hop int) []grpc.DialOption {
			return mustNew(t, noWait, WithObserver(named{log, hops[hop] + "-client"})).DialOptions()
		},
		ServerOptions: func(tier int) []grpc.ServerOption {
			return mustNew(t, WithObserver(named{log, tiers[tier] + "-server"})).ServerOptions()
		},
	})
	c.Tier("payment").SetDown(codes.Unavailable)
	_, _ = c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{})
	want := []string{
		"edge-client attempt_end #0 Unavailable",
		"edge-client attempt_start #0",
		"edge-client retry_refused server said do not retry",
		"gateway-client attempt_end #0 Unavailable",
		"gateway-client attempt_start #0",
		"gateway-client retry_refused server said do not retry",
		"gateway-server pushback_sent Unavailable",
		"gateway-server request_received depth=0",
		"order-client attempt_end #0 Unavailable",
		"order-client attempt_end #1 Unavailable",
		"order-client attempt_end #2 Unavailable",
		"order-client attempt_start #0",
		"order-client attempt_start #1",
		"order-client attempt_start #2",
		"order-client retry_refused attempts used up",
		"order-client retry_scheduled #1",
		"order-client retry_scheduled #2",
		"order-server pushback_sent Unavailable",
		"order-server request_received depth=1",
		// payment is down before its own interceptors run: no events.
	}
	if got := log.sorted(); !slices.Equal(got, want) {
		t.Fatalf("events:\n got %q\nwant %q", got, want)
	}
}

func TestBreakerObserver(t *testing.T) {
	log := &eventLog{}
	set := mustSet(t, breaker.Config{MinimumCalls: 1, Clock: clock.NewFake(time.Unix(0, 0)), OnStateChange: BreakerObserver(named{log, "b"})})
	p, _ := set.Get("payment").Allow()
	p.Done(breaker.Failure)
	if got, want := log.sorted(), []string{"b breaker_state_change payment closed->open"}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestBreakerObserverOncePerSet: the interceptors built from one Set and
// one observer (the documented UnaryClientInterceptor and
// StreamClientInterceptor with the same options, server options, one New
// per connection) report each breaker change once. Before the fix every
// New added a listener: 5 constructors, 5 events for one change.
func TestBreakerObserverOncePerSet(t *testing.T) {
	log := &eventLog{}
	set := mustSet(t, breaker.Config{MinimumCalls: 1, Clock: clock.NewFake(time.Unix(0, 0))})
	obs := Observers(named{log, "o"}) // Observers' result is comparable too
	opts := []Option{WithObserver(obs), WithBreaker(set)}
	_ = UnaryClientInterceptor(opts...)
	_ = StreamClientInterceptor(opts...)
	_ = ServerOptions(opts...)
	for range 3 {
		mustNew(t, opts...)
	}
	p, _ := set.Get("payment").Allow()
	p.Done(breaker.Failure)
	if got, want := log.sorted(), []string{"o breaker_state_change payment closed->open"}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestRangeLimiters(t *testing.T) {
	i := mustNew(t, noWait, WithBudget(budget.Config{Clock: frozen()}))
	f := &fakeInvoker{results: []error{errUnavailable}}
	_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	var targets []string
	var granted int64
	i.RangeLimiters(func(target string, l budget.Limiter) bool {
		targets = append(targets, target)
		granted = l.Snapshot().Granted
		return true
	})
	if fmt.Sprint(targets) != "[payment]" || granted != 2 { // the key of "passthrough:///payment"
		t.Fatalf("limiters: got %v with %d retries granted, want [payment] with 2", targets, granted)
	}
}

// TestOpenBreakerStopsBeforeScheduling: when order's breaker opens on a
// failed attempt, the retry is refused at once (no retry scheduled, no
// budget spent, no wait), and the refusal carries the attempt's code.
func TestOpenBreakerStopsBeforeScheduling(t *testing.T) {
	log := &eventLog{}
	set := mustSet(t, breaker.Config{ConsecutiveFailures: 1, Clock: frozen()})
	var s sleeps
	i := mustNew(t, s.option(), WithBreaker(set), WithBudget(budget.Config{Clock: frozen()}), WithObserver(named{log, "c"}))
	f := &fakeInvoker{results: []error{errUnavailable}}
	err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke)
	// New wires the observer into the breaker Set: the change is reported.
	want := []string{"c attempt_end #0 Unavailable", "c attempt_start #0",
		"c breaker_state_change payment closed->open", "c retry_refused circuit breaker open"}
	if got := log.sorted(); !slices.Equal(got, want) {
		t.Fatalf("events: got %q, want %q", got, want)
	}
	if len(f.seen) != 1 || len(s.d) != 0 || !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("%d attempts, waits %v, err %v: want 1 attempt, no wait, ErrOpen", len(f.seen), s.d, err)
	}
	var granted int64
	i.RangeLimiters(func(_ string, l budget.Limiter) bool { granted = l.Snapshot().Granted; return true })
	if granted != 0 {
		t.Fatalf("budget granted %d retries, want 0", granted)
	}
}

func TestObservers(t *testing.T) {
	a, b := &eventLog{}, &eventLog{}
	o := Observers(named{a, "a"}, named{b, "b"})
	o.Observe(context.Background(), Event{Kind: EventPushbackSent, Code: codes.Unavailable})
	if len(a.sorted()) != 1 || len(b.sorted()) != 1 {
		t.Fatalf("fan-out: got %v and %v, want one event each", a.sorted(), b.sorted())
	}
}

// Interceptors built from one set with an Observers value made afresh
// for each New (interceptor.New(WithObserver(Observers(m, am)), ...) per
// connection, as the stormotel docs wire it) report each breaker or
// throttle change once to each observer inside, not once per New.
// (From the review of stormotel, 2026-12-05.)
func TestFreshObserversReportChangesOnce(t *testing.T) {
	log := &eventLog{}
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set := mustSet(t, breaker.Config{MinimumCalls: 1, Clock: clk})
	thr, err := adaptive.NewSet(adaptive.Config{Clock: clk, Rand: func() float64 { return 0.5 }}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		inner := Observers(named{log, "a"}, named{log, "b"})
		mustNew(t, WithObserver(Observers(inner, named{log, "c"})), WithBreaker(set), WithAdaptive(thr))
	}
	p, _ := set.Get("payment").Allow()
	p.Done(breaker.Failure)
	markDown(t, thr.Get("payment"), clk)
	want := []string{
		"a breaker_state_change payment closed->open", "a target_down",
		"b breaker_state_change payment closed->open", "b target_down",
		"c breaker_state_change payment closed->open", "c target_down",
	}
	if got := log.sorted(); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// funcObserver and wrapObserver are observers a user may write: a func
// type (not comparable) and a struct holding one in an interface field
// (comparable by type, not by value).
type funcObserver func(context.Context, Event)

func (f funcObserver) Observe(ctx context.Context, e Event) { f(ctx, e) }

type wrapObserver struct{ o Observer }

func (w wrapObserver) Observe(ctx context.Context, e Event) { w.o.Observe(ctx, e) }

// Observers that cannot be compared by value neither panic when New
// keys the set's listeners by them, nor multiply: one Observers value
// shared by every New reports a change once. (From the review of the
// session's range, 2026-12-05: keying by the observers inside Observers
// compared a struct holding a func, and added a func observer once per
// New.)
func TestIncomparableObserversReportChangesOnce(t *testing.T) {
	var n atomic.Int32
	count := funcObserver(func(_ context.Context, e Event) {
		if e.Kind == EventBreakerStateChange {
			n.Add(1)
		}
	})
	for _, obs := range []Observer{Observers(count), Observers(wrapObserver{count}), wrapObserver{count}} {
		_, direct := obs.(wrapObserver)
		n.Store(0)
		set := mustSet(t, breaker.Config{MinimumCalls: 1, Clock: frozen()})
		for range 3 {
			mustNew(t, WithObserver(obs), WithBreaker(set))
		}
		p, _ := set.Get("payment").Allow()
		p.Done(breaker.Failure)
		switch got := n.Load(); {
		case direct && got != 3:
			// Not comparable and given as is: nothing tells it apart from
			// another, and each New adds a listener (documented).
			t.Errorf("%T: the change reported %d times, want once per New", obs, got)
		case !direct && got != 1:
			t.Errorf("%T: the change reported %d times, want once", obs, got)
		}
	}
}

// A nil pointer or func given as an observer (a typed nil, such as a
// *stormotel.Metrics never assigned) makes New fail, where it passed and
// panicked at the first event, which a handler's call would raise in the
// server; a nil Observer inside Observers is left out, as WithObserver(nil)
// means none. (From a new-user trial, 2026-12-05.)
func TestNilObservers(t *testing.T) {
	var nilRec *recorder
	var nilFunc funcObserver
	for name, o := range map[string]Observer{
		"typed nil":                  nilRec,
		"nil func":                   nilFunc,
		"typed nil inside Observers": Observers(&recorder{}, nilRec),
		"nil Observers value":        (*multiObserver)(nil),
	} {
		if _, err := New(WithObserver(o)); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: New: %v, want ErrInvalidOption", name, err)
		}
	}
	log := &eventLog{}
	i, err := New(WithObserver(Observers(nil, named{log, "a"})), WithCodes(codes.Unavailable))
	if err != nil {
		t.Fatalf("New with a nil Observer inside Observers: %v", err)
	}
	inv := &fakeInvoker{results: []error{status.Error(codes.Unavailable, "x"), nil}}
	if err := i.UnaryClient()(ctxTimeout(t, 10*time.Second), "/svc/M", nil, nil, newCC(t), inv.invoke); err != nil {
		t.Fatalf("call: %v", err)
	}
	if len(log.sorted()) == 0 {
		t.Fatal("no event reached the observer next to the nil one")
	}
}
