package stormotel_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
	"github.com/stormguard/stormguard/stormotel"
)

// fast makes retries all but immediate: the counts do not depend on the
// waits.
var fast = interceptor.WithBackoff(interceptor.Backoff{Base: time.Microsecond, Cap: time.Microsecond})

// The attributes of the test service's Unary method, as encoded by
// attribute.Set: keys in order.
const (
	unary    = "rpc.method=Unary,rpc.service=stormguard.testsvc.v1.TestService,rpc.system=grpc"
	unary14  = "rpc.grpc.status_code=14," + unary
	unaryOK  = "rpc.grpc.status_code=0," + unary
	refusals = "stormguard.client.retry.refusals{" + unary + ",stormguard.reason="
)

// proc is one process of the chain: the edge (the user's client) or a
// tier, with its own meter provider, as in production.
type proc struct {
	reader *sdkmetric.ManualReader
	m      *stormotel.Metrics
	ic     *interceptor.Interceptors
}

// chainSpec says what stormguard each process runs.
type chainSpec struct {
	// opts returns the client options of process name ("edge", "gateway",
	// "order", "payment"); m is the process's Metrics, for breakers.
	opts func(name string, m *stormotel.Metrics) []interceptor.Option
	// plain lists the processes whose client has no stormguard.
	plain []string
}

// startChain runs gateway -> order -> payment with stormguard and a
// Metrics in every process: the edge's client, and each tier's server and
// client, which share one Interceptors.
func startChain(t *testing.T, spec chainSpec) (*testsvc.Chain, map[string]*proc) {
	t.Helper()
	names := append([]string{"edge"}, testsvc.DefaultTiers...)
	procs := map[string]*proc{}
	for _, name := range names {
		r, mp := newProvider(t)
		m, err := stormotel.New(mp)
		if err != nil {
			t.Fatal(err)
		}
		opts := []interceptor.Option{fast, interceptor.WithObserver(m)}
		if spec.opts != nil {
			opts = append(opts, spec.opts(name, m)...)
		}
		ic, err := interceptor.New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		m.TrackLimiters(ic)
		procs[name] = &proc{reader: r, m: m, ic: ic}
	}
	c := testsvc.New(t, testsvc.Config{
		DialOptions: func(hop int) []grpc.DialOption {
			if slices.Contains(spec.plain, names[hop]) {
				return nil
			}
			return procs[names[hop]].ic.DialOptions()
		},
		ServerOptions: func(tier int) []grpc.ServerOption { return procs[names[tier+1]].ic.ServerOptions() },
	})
	return c, procs
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// call sends one request through the chain and checks its code.
func call(t *testing.T, c *testsvc.Chain, want codes.Code) {
	t.Helper()
	_, err := c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{})
	if got := status.Code(err); got != want {
		t.Fatalf("user got %v, want %v", err, want)
	}
}

// collect returns what r holds, one entry per data point: the instrument
// and its attributes, and the value (for histograms: the count, and for
// integer histograms the sum and the non-empty buckets by upper bound;
// float histograms hold times, which vary).
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	key := func(name string, attrs attribute.Set) string {
		return name + "{" + attrs.Encoded(attribute.DefaultEncoder()) + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = fmt.Sprint(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = fmt.Sprint(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = fmt.Sprint(p.Value)
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					s := fmt.Sprintf("count=%d sum=%d", p.Count, p.Sum)
					for i, n := range p.BucketCounts {
						if n == 0 {
							continue
						}
						le := "+Inf"
						if i < len(p.Bounds) {
							le = fmt.Sprint(p.Bounds[i])
						}
						s += fmt.Sprintf(" le%s:%d", le, n)
					}
					out[key(m.Name, p.Attributes)] = s
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = fmt.Sprintf("count=%d", p.Count)
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// checkMetrics compares every process's data points with want.
func checkMetrics(t *testing.T, procs map[string]*proc, want map[string]map[string]string) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(procs)) {
		got := collect(t, procs[name].reader)
		if w := want[name]; !maps.Equal(got, w) {
			t.Errorf("%s: metrics differ\n%s", name, diff(got, w))
		}
	}
}

func diff(got, want map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if w, ok := want[k]; !ok {
			fmt.Fprintf(&b, "  unexpected %s = %s\n", k, got[k])
		} else if w != got[k] {
			fmt.Fprintf(&b, "  %s: got %s, want %s\n", k, got[k], w)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if _, ok := got[k]; !ok {
			fmt.Fprintf(&b, "  missing %s = %s\n", k, want[k])
		}
	}
	return b.String()
}

// server returns a tier's server-side data points for n requests, all
// first attempts at depth, and pushbacks answers with UNAVAILABLE.
func server(depth, n, pushbacks int) map[string]string {
	m := map[string]string{
		"stormguard.server.request.attempt{" + unary + "}":          fmt.Sprintf("count=%d sum=0 le0:%d", n, n),
		"stormguard.server.request.depth{" + unary + "}":            fmt.Sprintf("count=%d sum=%d le%d:%d", n, n*depth, depth, n),
		"stormguard.server.request.upstream_retries{" + unary + "}": fmt.Sprintf("count=%d sum=0 le0:%d", n, n),
	}
	if pushbacks > 0 {
		m["stormguard.server.pushbacks{"+unary14+"}"] = fmt.Sprint(pushbacks)
	}
	return m
}

// client returns a client's data points for attempts to target that all
// failed with UNAVAILABLE, scheduled retries, and refusals by reason.
// Client instruments carry the target: the normalized key of the
// connection ("passthrough:///payment" is "payment").
func client(target string, attempts, retries int, refused map[string]int) map[string]string {
	tg := ",stormguard.target=" + target + "}"
	m := map[string]string{
		"stormguard.client.attempts{" + unary14 + tg:         fmt.Sprint(attempts),
		"stormguard.client.attempt.duration{" + unary14 + tg: fmt.Sprintf("count=%d", attempts),
	}
	if retries > 0 {
		m["stormguard.client.retries{"+unary+tg] = fmt.Sprint(retries)
		m["stormguard.client.retry.delay{"+unary+tg] = fmt.Sprintf("count=%d", retries)
	}
	for reason, n := range refused {
		m[refusals+reason+tg] = fmt.Sprint(n)
	}
	return m
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}

// TestPaymentDownOneRequest: stormguard on every hop, payment down, one
// request. Only order retries (3 attempts, 2 retries, then "attempts used
// up"); order and gateway answer with the pushback, so gateway and the
// edge stop after one attempt each. Payment fails before its interceptors
// run: it reports nothing.
func TestPaymentDownOneRequest(t *testing.T) {
	c, procs := startChain(t, chainSpec{})
	c.Tier("payment").SetDown(codes.Unavailable)
	call(t, c, codes.Unavailable)
	checkMetrics(t, procs, map[string]map[string]string{
		"edge":    client("gateway", 1, 0, map[string]int{"pushback": 1}),
		"gateway": merge(server(0, 1, 1), client("order", 1, 0, map[string]int{"pushback": 1})),
		"order":   merge(server(1, 1, 1), client("payment", 3, 2, map[string]int{"attempts": 1})),
		"payment": {},
	})
	if got := c.Tier("payment").Received(testsvc.Unary); got != 3 {
		t.Errorf("payment received %d calls, want 3", got)
	}
}

// TestServerSeesRetries: order's client has no stormguard, so order passes
// payment's failure up without the pushback and gateway retries order. The
// order server sees attempts 0, 1 and 2 of one request: the SRE book's
// "how many of my requests are retries".
func TestServerSeesRetries(t *testing.T) {
	c, procs := startChain(t, chainSpec{plain: []string{"order"}})
	c.Tier("payment").SetDown(codes.Unavailable)
	call(t, c, codes.Unavailable)
	checkMetrics(t, procs, map[string]map[string]string{
		"edge":    client("gateway", 1, 0, map[string]int{"pushback": 1}),
		"gateway": merge(server(0, 1, 1), client("order", 3, 2, map[string]int{"attempts": 1})),
		"order": {
			"stormguard.server.request.attempt{" + unary + "}":          "count=3 sum=3 le0:1 le1:1 le2:1",
			"stormguard.server.request.depth{" + unary + "}":            "count=3 sum=3 le1:3",
			"stormguard.server.request.upstream_retries{" + unary + "}": "count=3 sum=3 le0:1 le1:1 le2:1",
		},
		"payment": {},
	})
}

// TestBudgetRefusals: every hop has a budget of 0.5 retries per request
// without floor, on a frozen clock, so every decision is exact. With
// payment down, order's budget grants a retry when retries < 0.5 x
// requests: request 1 (0 < 0.5) gets one retry, then 1 < 0.5 fails;
// request 2: 1 < 1 fails; request 3: 1 < 1.5 grants, 2 < 1.5 fails;
// request 4: 2 < 2 fails. So 6 attempts, 2 retries, 4 budget refusals, a
// ratio of 2/4. Gateway and the edge get the pushback and never ask their
// budgets: ratio 0.
func TestBudgetRefusals(t *testing.T) {
	c, procs := startChain(t, chainSpec{opts: func(string, *stormotel.Metrics) []interceptor.Option {
		return []interceptor.Option{interceptor.WithBudget(budget.Config{
			Ratio: 0.5, NoFloor: true, Clock: clock.NewFake(time.Unix(1_000_000, 0)),
		})}
	}})
	c.Tier("payment").SetDown(codes.Unavailable)
	for range 4 {
		call(t, c, codes.Unavailable)
	}
	ratio := func(target, v string) map[string]string {
		return map[string]string{"stormguard.budget.ratio{stormguard.target=" + target + "}": v}
	}
	checkMetrics(t, procs, map[string]map[string]string{
		"edge":    merge(client("gateway", 4, 0, map[string]int{"pushback": 4}), ratio("gateway", "0")),
		"gateway": merge(server(0, 4, 4), client("order", 4, 0, map[string]int{"pushback": 4}), ratio("order", "0")),
		"order":   merge(server(1, 4, 4), client("payment", 6, 2, map[string]int{"budget": 4}), ratio("payment", "0.5")),
		"payment": {},
	})
}

// TestThrottleTokens: gRFC A6 throttles (10 tokens, one taken per failure)
// on every hop, one request with payment down. Order's throttle loses 3
// tokens (three failures); gateway's and the edge's lose one each, for the
// failure that came with the pushback.
func TestThrottleTokens(t *testing.T) {
	c, procs := startChain(t, chainSpec{opts: func(string, *stormotel.Metrics) []interceptor.Option {
		return []interceptor.Option{interceptor.WithThrottle(budget.ThrottleConfig{})}
	}})
	c.Tier("payment").SetDown(codes.Unavailable)
	call(t, c, codes.Unavailable)
	tokens := func(target, v string) map[string]string {
		return map[string]string{"stormguard.throttle.tokens{stormguard.target=" + target + "}": v}
	}
	checkMetrics(t, procs, map[string]map[string]string{
		"edge":    merge(client("gateway", 1, 0, map[string]int{"pushback": 1}), tokens("gateway", "9")),
		"gateway": merge(server(0, 1, 1), client("order", 1, 0, map[string]int{"pushback": 1}), tokens("order", "9")),
		"order":   merge(server(1, 1, 1), client("payment", 3, 2, map[string]int{"attempts": 1}), tokens("payment", "7")),
		"payment": {},
	})
}

// TestBreakerOpens: order has a breaker that opens after 3 failures in a
// row, on a fake clock. Request 1 makes 3 attempts and opens it; request 2
// is refused by the open breaker without an attempt; after the open
// interval, with payment back, request 3 probes, and the breaker closes.
func TestBreakerOpens(t *testing.T) {
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	var set *breaker.Set
	c, procs := startChain(t, chainSpec{opts: func(name string, m *stormotel.Metrics) []interceptor.Option {
		if name != "order" {
			return nil
		}
		var err error
		set, err = breaker.NewSet(breaker.Config{
			ConsecutiveFailures: 3, OpenInterval: time.Second, Jitter: breaker.NoJitter, HalfOpenProbes: 1,
			Clock: fc, // no OnStateChange: interceptor.New reports the transitions to m
		}, 0)
		if err != nil {
			t.Fatal(err)
		}
		m.TrackBreakers(set)
		return []interceptor.Option{interceptor.WithBreaker(set)}
	}})
	order := procs["order"]
	const (
		state       = "stormguard.breaker.state{stormguard.target=payment}"
		transitions = "stormguard.breaker.transitions{stormguard.breaker.to_state=%s,stormguard.target=payment}"
	)
	pay := c.Tier("payment")
	pay.SetDown(codes.Unavailable)

	call(t, c, codes.Unavailable)
	want := merge(server(1, 1, 1), client("payment", 3, 2, map[string]int{"attempts": 1}), map[string]string{
		state:                            "2",
		fmt.Sprintf(transitions, "open"): "1",
	})
	if got := collect(t, order.reader); !maps.Equal(got, want) {
		t.Fatalf("order after request 1:\n%s", diff(got, want))
	}

	call(t, c, codes.Unavailable)
	want = merge(want, server(1, 2, 2), map[string]string{refusals + "breaker_open,stormguard.target=payment}": "1"})
	if got := collect(t, order.reader); !maps.Equal(got, want) {
		t.Fatalf("order after request 2:\n%s", diff(got, want))
	}
	if got := pay.Received(testsvc.Unary); got != 3 {
		t.Fatalf("payment received %d calls, want 3, all from request 1 (the open breaker let none of request 2 through)", got)
	}

	pay.SetUp()
	fc.Advance(time.Second)
	call(t, c, codes.OK)
	want = merge(want, server(1, 3, 2), map[string]string{
		state:                                 "0",
		fmt.Sprintf(transitions, "half_open"): "1",
		fmt.Sprintf(transitions, "closed"):    "1",
		"stormguard.client.attempts{" + unaryOK + ",stormguard.target=payment}":         "1",
		"stormguard.client.attempt.duration{" + unaryOK + ",stormguard.target=payment}": "count=1",
	})
	if got := collect(t, order.reader); !maps.Equal(got, want) {
		t.Fatalf("order after request 3:\n%s", diff(got, want))
	}
	// The tiers above saw two failures with the pushback, then a success.
	gw := collect(t, procs["gateway"].reader)
	if got, want := gw[refusals+"pushback,stormguard.target=order}"], "2"; got != want {
		t.Errorf("gateway pushback refusals: got %s, want %s", got, want)
	}
}
