package stormotel

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/stormguard/stormguard/interceptor"
)

func TestSplitMethod(t *testing.T) {
	tests := []struct {
		full, service, method string
		ok                    bool
	}{
		{"/pkg.Service/Method", "pkg.Service", "Method", true},
		{"/a.b.v1.S/M", "a.b.v1.S", "M", true},
		{"/a/b/C", "a/b", "C", true},
		{"pkg.Service/Method", "", "", false},
		{"/pkg.Service/", "", "", false},
		{"//Method", "", "", false},
		{"/Method", "", "", false},
		{"", "", "", false},
	}
	for _, tt := range tests {
		s, m, ok := splitMethod(tt.full)
		if s != tt.service || m != tt.method || ok != tt.ok {
			t.Errorf("splitMethod(%q): got %q, %q, %v, want %q, %q, %v", tt.full, s, m, ok, tt.service, tt.method, tt.ok)
		}
	}
}

// TestMaxMethods: past MaxMethods distinct methods, the rest are counted
// under rpc.method "_OTHER".
func TestMaxMethods(t *testing.T) {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	m, err := New(mp)
	if err != nil {
		t.Fatal(err)
	}
	const extra = 5
	for i := range MaxMethods + extra {
		m.Observe(context.Background(), interceptor.Event{Kind: interceptor.EventRetryScheduled, Method: fmt.Sprintf("/pkg.S/M%d", i)})
	}
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	points, other := 0, int64(0)
	for _, sm := range rm.ScopeMetrics {
		for _, met := range sm.Metrics {
			if met.Name != "stormguard.client.retries" {
				continue
			}
			for _, p := range met.Data.(metricdata.Sum[int64]).DataPoints {
				points++
				if v, _ := p.Attributes.Value(attribute.Key("rpc.method")); v.AsString() == "_OTHER" {
					other = p.Value
				}
			}
		}
	}
	if points != MaxMethods+1 || other != extra {
		t.Fatalf("got %d series with %d retries under _OTHER, want %d series with %d", points, other, MaxMethods+1, extra)
	}
}

func TestReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for r := interceptor.StopReason(0); r <= interceptor.StopCommitted+1; r++ {
		seen[reasonNames[reasonIndex(r)]] = true
	}
	if len(seen) != numReasons {
		t.Fatalf("reasons reachable: %v, want all %d", seen, numReasons)
	}
}

// TestTargetAttribute: client instruments carry stormguard.target, server
// instruments do not, and distinct target and method pairs are capped at
// MaxMethods like methods: a process that talks to ever new targets
// cannot grow the series without bound.
func TestTargetAttribute(t *testing.T) {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	m, err := New(mp)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const extra = 3
	for i := range MaxMethods + extra {
		m.Observe(ctx, interceptor.Event{Kind: interceptor.EventRetryScheduled, Method: "/pkg.S/M", Target: fmt.Sprintf("t%d:443", i)})
	}
	m.Observe(ctx, interceptor.Event{Kind: interceptor.EventRequestReceived, Method: "/pkg.S/M"})
	var rm metricdata.ResourceMetrics
	if err := r.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	targets := map[string]int64{}
	serverPoints := 0
	for _, sm := range rm.ScopeMetrics {
		for _, met := range sm.Metrics {
			switch met.Name {
			case "stormguard.client.retries":
				for _, p := range met.Data.(metricdata.Sum[int64]).DataPoints {
					v, ok := p.Attributes.Value(TargetKey)
					if !ok {
						t.Fatalf("a client data point without %s: %v", TargetKey, p.Attributes)
					}
					targets[v.AsString()] += p.Value
				}
			case "stormguard.server.request.attempt":
				for _, p := range met.Data.(metricdata.Histogram[int64]).DataPoints {
					serverPoints++
					if _, ok := p.Attributes.Value(TargetKey); ok {
						t.Errorf("a server data point with %s: %v", TargetKey, p.Attributes)
					}
					if v, _ := p.Attributes.Value(semconv.RPCMethodKey); v.AsString() != "M" {
						t.Errorf("the server's method reported as %q, want M: the clients' pairs have a cap of their own", v.AsString())
					}
				}
			}
		}
	}
	if got := targets["t0:443"]; got != 1 {
		t.Errorf("retries for t0:443: got %d, want 1", got)
	}
	if len(targets) != MaxMethods+1 || targets[otherValue] != extra {
		t.Errorf("got %d targets, %d retries under %s; want %d targets, %d", len(targets), targets[otherValue], otherValue, MaxMethods+1, extra)
	}
	if serverPoints != 1 {
		t.Errorf("server data points: got %d, want 1", serverPoints)
	}
}
