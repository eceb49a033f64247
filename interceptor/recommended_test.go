package interceptor

import (
	"context"
	"testing"
	"time"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/internal/clock"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRecommended: the one-line configuration installs the throttle, the
// budget and admission control, and each call of Recommended gets state
// of its own.
func TestRecommended(t *testing.T) {
	a, err := New(Recommended()...)
	if err != nil {
		t.Fatalf("New(Recommended()...): %v", err)
	}
	b := mustNew(t, Recommended()...)
	switch {
	case a.client.cfg.throttles == nil:
		t.Error("no adaptive throttle")
	case a.client.cfg.limiters == nil:
		t.Error("no retry budget")
	case a.Admission() == nil:
		t.Error("no admission control")
	case a.client.cfg.breakers != nil:
		t.Error("a breaker, which Recommended leaves out")
	}
	if a.client.cfg.throttles == b.client.cfg.throttles || a.client.cfg.limiters == b.client.cfg.limiters || a.Admission() == b.Admission() {
		t.Error("two calls of Recommended share state")
	}
	// The parts cannot be given per call (each is refused, see
	// TestPerCallMisuseIsInternal).
	f := &fakeInvoker{results: []error{nil}}
	if err := a.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke, Recommended()[0]); status.Code(err) != codes.Internal {
		t.Errorf("Recommended per call: got %v, want Internal", err)
	}
}

// TestRecommendedOneMethodFailing: under Recommended, one method failing
// everything (a watch whose backend is down, re-opened at once by its
// callers) neither sheds nor holds down the calls of another that the
// target serves: the throttle sheds each method no more than its own
// outcomes say. With one shedding probability for the target, a user's
// trial served 16-39 % of the healthy calls (retries off 100 %) and
// marked the target down 3-11 times in 3 s.
func TestRecommendedOneMethodFailing(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var events recorder
	draws := 0
	set, err := adaptive.NewSet(adaptive.Config{Clock: clk, Hold: -1, OnDown: AdaptiveObserver(&events),
		Rand: func() float64 { draws++; return float64(draws%100) / 100 }}, 0) // spread over [0, 1)
	if err != nil {
		t.Fatal(err)
	}
	i := mustNew(t, append(Recommended(), WithAdaptive(set), WithObserver(&events), noWait)...)
	sent := map[string]int{}
	invoke := func(_ context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		sent[method]++
		if method == "/svc/Watch" {
			return status.Error(codes.Unavailable, "watch backend down")
		}
		return nil
	}
	cc := newCC(t)
	call := func(method string) error {
		return i.UnaryClient()(ctxTimeout(t, time.Minute), method, nil, nil, cc, invoke, WithMaxAttempts(1))
	}
	for range 100 { // 1 s of healthy gets first
		if err := call("/svc/Get"); err != nil {
			t.Fatal(err)
		}
		clk.Advance(10 * time.Millisecond)
	}
	sent["/svc/Get"] = 0
	gets, watches := 0, 0
	for range 200 { // 2 s: 20 watch opens and one get every 10 ms
		for range 20 {
			_ = call("/svc/Watch")
			watches++
		}
		if err := call("/svc/Get"); err != nil {
			var st adaptive.Stats
			i.RangeThrottles(func(_ string, th *adaptive.Throttle) bool { st = th.Stats(); return true })
			t.Fatalf("get %d, with the watch failing: %v; want served (%+v)", gets, err, st)
		}
		gets++
		clk.Advance(10 * time.Millisecond)
	}
	if sent["/svc/Get"] != gets {
		t.Errorf("%d gets sent of %d", sent["/svc/Get"], gets)
	}
	// The watch is shed as the target is.
	if n := sent["/svc/Watch"]; n*2 > watches {
		t.Errorf("%d of %d watch opens sent to a method failing everything, want under half", n, watches)
	}
	if n := events.count(EventTargetDown); n != 0 {
		t.Errorf("%d downs of a target that serves its gets, want none", n)
	}
}
