package stormotel_test

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/stormotel"
)

func newMetrics(t testing.TB) (*stormotel.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	r, mp := newProvider(t)
	m, err := stormotel.New(mp)
	if err != nil {
		t.Fatal(err)
	}
	return m, r
}

// TestBreakerGauge drives breakers by hand: the gauge follows the tracked
// sets, reports the most severe state of a key found in several sets, and
// forgets a breaker its set evicted (where a gauge rebuilt from the
// transition events would show it half-open for ever).
func TestBreakerGauge(t *testing.T) {
	m, r := newMetrics(t)
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	cfg := breaker.Config{ConsecutiveFailures: 1, OpenInterval: time.Second, Jitter: breaker.NoJitter,
		HalfOpenProbes: 1, Clock: fc, OnStateChange: interceptor.BreakerObserver(m)}
	one, err := breaker.NewSet(cfg, 1) // room for one breaker
	if err != nil {
		t.Fatal(err)
	}
	other, err := breaker.NewSet(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	m.TrackBreakers(one, other, nil, one)

	const (
		stateA = "stormguard.breaker.state{stormguard.target=a}"
		stateB = "stormguard.breaker.state{stormguard.target=b}"
		toOpen = "stormguard.breaker.transitions{stormguard.breaker.to_state=open,stormguard.target=a}"
		toHalf = "stormguard.breaker.transitions{stormguard.breaker.to_state=half_open,stormguard.target=a}"
	)
	check := func(step string, want map[string]string) {
		t.Helper()
		if got := collect(t, r); !maps.Equal(got, want) {
			t.Fatalf("%s:\n%s", step, diff(got, want))
		}
	}
	check("no breakers", map[string]string{})

	a := one.Get("a")
	check("a closed", map[string]string{stateA: "0"})

	p, _ := a.Allow()
	p.Done(breaker.Failure)
	check("a open", map[string]string{stateA: "2", toOpen: "1"})

	fc.Advance(time.Second)
	probe, err := a.Allow()
	if err != nil {
		t.Fatal(err)
	}
	check("a half-open", map[string]string{stateA: "1", toOpen: "1", toHalf: "1"})

	other.Get("a") // closed in the other set: the half-open one wins
	check("a in two sets", map[string]string{stateA: "1", toOpen: "1", toHalf: "1"})

	one.Get("b") // evicts a from the full set
	check("a evicted", map[string]string{stateA: "0", stateB: "0", toOpen: "1", toHalf: "1"})
	probe.Done(breaker.Ignored)

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	check("closed", map[string]string{toOpen: "1", toHalf: "1"})
}

// TestOddEvents: codes past the known ones and reasons the interceptors do
// not report yet still get attributes.
func TestOddEvents(t *testing.T) {
	m, r := newMetrics(t)
	ctx := context.Background()
	m.Observe(ctx, interceptor.Event{Kind: interceptor.EventAttemptEnd, Method: "/pkg.S/M", Code: codes.Code(99)})
	m.Observe(ctx, interceptor.Event{Kind: interceptor.EventRetryRefused, Method: "/pkg.S/M", Reason: interceptor.StopReason(42)})
	m.Observe(ctx, interceptor.Event{Kind: interceptor.EventRetryRefused, Method: "bad", Reason: interceptor.StopCommitted})
	m.Observe(ctx, interceptor.Event{Kind: interceptor.EventAttemptStart, Method: "/pkg.S/M"}) // not recorded
	m.Observe(ctx, interceptor.Event{Kind: interceptor.EventBreakerStateChange, Target: "t", From: breaker.Open, To: breaker.State(7)})
	m.Observe(ctx, interceptor.Event{Kind: interceptor.EventStackedRetry, Method: "/pkg.S/M"})
	want := map[string]string{
		"stormguard.server.stacked_retries{rpc.method=M,rpc.service=pkg.S,rpc.system=grpc}":                          "1",
		"stormguard.client.attempts{rpc.grpc.status_code=99,rpc.method=M,rpc.service=pkg.S,rpc.system=grpc}":         "1",
		"stormguard.client.attempt.duration{rpc.grpc.status_code=99,rpc.method=M,rpc.service=pkg.S,rpc.system=grpc}": "count=1",
		"stormguard.client.retry.refusals{rpc.method=M,rpc.service=pkg.S,rpc.system=grpc,stormguard.reason=other}":   "1",
		"stormguard.client.retry.refusals{rpc.method=bad,rpc.system=grpc,stormguard.reason=committed}":               "1",
		"stormguard.breaker.transitions{stormguard.breaker.to_state=unknown,stormguard.target=t}":                    "1",
	}
	if got := collect(t, r); !maps.Equal(got, want) {
		t.Fatalf("metrics:\n%s", diff(got, want))
	}
}

// TestNewNilProvider: New(nil) records to the global MeterProvider, as
// its doc says. (Not parallel: it sets the global provider.)
func TestNewNilProvider(t *testing.T) {
	prev := otel.GetMeterProvider()
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	otel.SetMeterProvider(mp)
	t.Cleanup(func() {
		otel.SetMeterProvider(prev)
		_ = mp.Shutdown(context.Background())
	})
	m, err := stormotel.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Observe(context.Background(), interceptor.Event{Kind: interceptor.EventAttemptEnd, Method: "/pkg.S/M", Target: "dns:///t"})
	got := collect(t, r)
	found := false
	for k, v := range got {
		if strings.HasPrefix(k, "stormguard.client.attempts{") && v == "1" {
			found = true
		}
	}
	if !found {
		t.Fatalf("the global provider got %v, want stormguard.client.attempts = 1", got)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

// events is a mix of the events of a retrying client and of a server.
var events = []interceptor.Event{
	{Kind: interceptor.EventAttemptStart, Method: "/pkg.Payment/Pay", Target: "dns:///payment"},
	{Kind: interceptor.EventAttemptEnd, Method: "/pkg.Payment/Pay", Target: "dns:///payment", Code: codes.Unavailable, Duration: 3 * time.Millisecond},
	{Kind: interceptor.EventRetryScheduled, Method: "/pkg.Payment/Pay", Target: "dns:///payment", Attempt: 1, Delay: 20 * time.Millisecond},
	{Kind: interceptor.EventAttemptEnd, Method: "/pkg.Payment/Pay", Target: "dns:///payment", Code: codes.OK, Duration: 2 * time.Millisecond},
	{Kind: interceptor.EventRetryRefused, Method: "/pkg.Payment/Pay", Target: "dns:///payment", Attempt: 3, Reason: interceptor.StopBudget},
	{Kind: interceptor.EventRequestReceived, Method: "/pkg.Order/Create", Info: interceptor.Info{Depth: 1, Attempt: 1, UpstreamRetries: 1}},
	{Kind: interceptor.EventPushbackSent, Method: "/pkg.Order/Create", Code: codes.Unavailable},
}

// BenchmarkObserve records a mix of events, in parallel. With the SDK it
// must not allocate per event: attribute sets are precomputed.
func BenchmarkObserve(b *testing.B) {
	sdk := func(b *testing.B) *stormotel.Metrics { m, _ := newMetrics(b); return m }
	for _, bc := range []struct {
		name string
		new  func(*testing.B) *stormotel.Metrics
	}{
		{"noop", func(b *testing.B) *stormotel.Metrics {
			m, err := stormotel.New(noop.NewMeterProvider())
			if err != nil {
				b.Fatal(err)
			}
			return m
		}},
		{"sdk", sdk},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := bc.new(b)
			ctx := context.Background()
			for _, e := range events { // warm the attribute cache
				m.Observe(ctx, e)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					m.Observe(ctx, events[i%len(events)])
					i++
				}
			})
		})
	}
}

// newProvider returns a MeterProvider whose reader the test collects
// from, shut down when the test ends.
func newProvider(t testing.TB) (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	t.Helper()
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return r, mp
}
