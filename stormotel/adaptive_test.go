package stormotel_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/stormotel"
)

// TestAdaptiveMetrics drives a throttle by hand: the gauges follow its
// state, and the events count refusals, probes and transitions.
func TestAdaptiveMetrics(t *testing.T) {
	r, mp := newProvider(t)
	m, err := stormotel.NewAdaptive(mp)
	if err != nil {
		t.Fatal(err)
	}
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	set, err := adaptive.NewSet(adaptive.Config{Clock: fc, Rand: func() float64 { return 0.5 }, OnDown: interceptor.AdaptiveObserver(m)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	m.Track(set, nil, set)
	const (
		prob  = "stormguard.adaptive.rejection_probability{stormguard.target=a}"
		down  = "stormguard.adaptive.down{stormguard.target=a}"
		toDn  = "stormguard.adaptive.transitions{stormguard.adaptive.down=true,stormguard.target=a}"
		toUp  = "stormguard.adaptive.transitions{stormguard.adaptive.down=false,stormguard.target=a}"
		refus = "stormguard.adaptive.refusals{stormguard.target=a}"
		probe = "stormguard.adaptive.probes{stormguard.target=a}"
	)
	check := func(step string, want map[string]string) {
		t.Helper()
		if got := collect(t, r); !maps.Equal(got, want) {
			t.Fatalf("%s:\n%s", step, diff(got, want))
		}
	}
	a := set.Get("a")
	check("a up", map[string]string{prob: "0", down: "0"})

	p, _ := a.Allow(false)
	p.Done(adaptive.Accept)
	fc.Advance(time.Second)
	a.Connectivity(false) // a dead process: one failure marks it down
	p, _ = a.Allow(false)
	p.Done(adaptive.Overload)
	check("a down", map[string]string{prob: "1", down: "1", toDn: "1"})

	ctx := context.Background()
	m.Observe(ctx, interceptor.Event{Kind: interceptor.EventThrottled, Target: "a", Probability: 1})
	m.Observe(ctx, interceptor.Event{Kind: interceptor.EventProbe, Target: "a"})
	m.Observe(ctx, interceptor.Event{Kind: interceptor.EventAttemptStart, Target: "a"}) // not ours
	a.Revive()
	check("a back", map[string]string{prob: "0", down: "0", toDn: "1", toUp: "1", refus: "1", probe: "1"})

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	check("closed", map[string]string{toDn: "1", toUp: "1", refus: "1", probe: "1"})
}

// The adaptive counters keep at most MaxTargets targets as series of
// their own, the later ones under "_OTHER", as do the breaker
// transitions: a client whose targets churn (pod addresses through
// rolling deploys) must not grow the series without bound. (From the
// review of 2026-12-05.)
func TestTargetCountersCapped(t *testing.T) {
	r, mp := newProvider(t)
	am, err := stormotel.NewAdaptive(mp)
	if err != nil {
		t.Fatal(err)
	}
	m, err := stormotel.New(mp)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const extra = 5
	for i := range stormotel.MaxTargets + extra {
		target := fmt.Sprintf("10.0.%d.%d:443", i/256, i%256)
		am.Observe(ctx, interceptor.Event{Kind: interceptor.EventTargetDown, Target: target})
		am.Observe(ctx, interceptor.Event{Kind: interceptor.EventThrottled, Target: target})
		m.Observe(ctx, interceptor.Event{Kind: interceptor.EventBreakerStateChange, Target: target, To: breaker.Open})
	}
	got := collect(t, r)
	for _, name := range []string{"stormguard.adaptive.transitions", "stormguard.adaptive.refusals", "stormguard.breaker.transitions"} {
		series, other := 0, ""
		for k, v := range got {
			if strings.HasPrefix(k, name+"{") {
				series++
				if strings.Contains(k, "stormguard.target=_OTHER") {
					other = v
				}
			}
		}
		if series != stormotel.MaxTargets+1 || other != fmt.Sprint(extra) {
			t.Errorf("%s: %d series, %q under _OTHER; want %d, %d", name, series, other, stormotel.MaxTargets+1, extra)
		}
	}
}

// The gauges of Recommended()'s throttles, whose set is made inside it,
// through TrackThrottles. (From an operator's trial: Track wanted the
// set, which Recommended() hides, so the gauges could not be had with
// the recommended line.) A set tracked both ways, and a second set with
// the same target, run through the collection too; that the first is
// observed once the reader cannot tell (the last observation of an
// attribute set wins), so only the series are asserted.
func TestTrackThrottles(t *testing.T) {
	r, mp := newProvider(t)
	m, err := stormotel.NewAdaptive(mp)
	if err != nil {
		t.Fatal(err)
	}
	ic, err := interceptor.New(interceptor.Recommended()...)
	if err != nil {
		t.Fatal(err)
	}
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	set, err := adaptive.NewSet(adaptive.Config{Clock: fc}, 0)
	if err != nil {
		t.Fatal(err)
	}
	own, err := interceptor.New(interceptor.WithAdaptive(set))
	if err != nil {
		t.Fatal(err)
	}
	m.TrackThrottles(ic, nil, ic, own)
	m.Track(set)
	ic.RangeThrottles(func(string, *adaptive.Throttle) bool { t.Fatal("a throttle before any call"); return false })
	// Throttles are made by calls; make one in each.
	invoke := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	cc, err := grpc.NewClient("passthrough:///payment", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, i := range []*interceptor.Interceptors{ic, own} {
		if err := i.UnaryClient()(ctx, "/svc/M", nil, nil, cc, invoke); err != nil {
			t.Fatal(err)
		}
	}
	got := collect(t, r)
	want := map[string]string{
		"stormguard.adaptive.rejection_probability{stormguard.target=payment}": "0",
		"stormguard.adaptive.down{stormguard.target=payment}":                  "0",
	}
	if !maps.Equal(got, want) {
		t.Fatalf("gauges:\n%s", diff(got, want))
	}
}
