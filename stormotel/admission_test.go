package stormotel_test

import (
	"context"
	"maps"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/stormotel"
)

// TestAdmission: the gauges follow the tracked limiter, and refusals are
// counted by reason.
func TestAdmission(t *testing.T) {
	a, r := newAdmission(t)
	i, err := interceptor.New(interceptor.WithAdmission(admission.Config{MaxInFlight: 3}), interceptor.WithObserver(a))
	if err != nil {
		t.Fatal(err)
	}
	a.Track("payment", i)
	a.Track("none", nil)
	p, err := i.Admission().Acquire(admission.ClassFirst, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(admission.Ignored)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _ = i.UnaryServer()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/s/M"}, func(context.Context, any) (any, error) { return nil, nil })
	a.Observe(context.Background(), interceptor.Event{Kind: interceptor.EventAdmissionRefused, Admission: interceptor.AdmissionLimit})
	a.Observe(context.Background(), interceptor.Event{Kind: interceptor.EventAdmissionRefused, Admission: interceptor.AdmissionQueueTimeout})
	a.Observe(context.Background(), interceptor.Event{Kind: interceptor.EventAdmissionRefused, Admission: interceptor.AdmissionOverload})
	a.Observe(context.Background(), interceptor.Event{Kind: interceptor.EventAdmissionRefused, Admission: 99})
	a.Observe(context.Background(), interceptor.Event{Kind: interceptor.EventRequestReceived})

	want := map[string]string{
		"stormguard.admission.overloaded{stormguard.admission.server=payment}":                     "0",
		"stormguard.admission.in_flight{stormguard.admission.server=payment}":                      "1",
		"stormguard.admission.latency{stormguard.admission.server=payment}":                        "0",
		"stormguard.admission.queue{stormguard.admission.server=payment}":                          "0",
		"stormguard.admission.refusals{rpc.system=grpc,stormguard.admission.reason=queue_timeout}": "1",
		"stormguard.admission.refusals{rpc.system=grpc,stormguard.admission.reason=caller_gone}":   "1",
		"stormguard.admission.refusals{rpc.system=grpc,stormguard.admission.reason=limit}":         "1",
		"stormguard.admission.refusals{rpc.system=grpc,stormguard.admission.reason=overload}":      "1",
		"stormguard.admission.refusals{rpc.system=grpc,stormguard.admission.reason=other}":         "1",
	}
	if got := collect(t, r); !maps.Equal(got, want) {
		t.Fatalf("%s", diff(got, want))
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestAdmissionHealth: a server with WithHealth and no admission control
// is tracked; its gauge follows its serving state and the counter its
// NOT_SERVING changes.
func TestAdmissionHealth(t *testing.T) {
	a, r := newAdmission(t)
	i, err := interceptor.New(interceptor.WithHealth(health.NewServer(), admission.ServingConfig{MinFailures: 1, Quiet: time.Nanosecond, Trial: time.Hour, TrialFailures: 1}))
	if err != nil {
		t.Fatal(err)
	}
	a.Track("payment", i)
	a.Track("payment", i) // again: counted once (review of 2026-12-05)
	want := map[string]string{
		"stormguard.health.serving{stormguard.admission.server=payment}":     "1",
		"stormguard.health.not_serving{stormguard.admission.server=payment}": "0",
	}
	if got := collect(t, r); !maps.Equal(got, want) {
		t.Fatalf("serving: %s", diff(got, want))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	fail := func(context.Context, any) (any, error) { return nil, status.Error(codes.Unavailable, "db down") }
	// Quiet is 1 ns: a later failure ends the run (bounded loop).
	for n := 0; i.Serving().Serving(); n++ {
		if n == 1000 {
			t.Fatal("still serving after 1000 failures")
		}
		_, _ = i.UnaryServer()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/s/M"}, fail)
	}
	want = map[string]string{
		"stormguard.health.serving{stormguard.admission.server=payment}":     "0",
		"stormguard.health.not_serving{stormguard.admission.server=payment}": "1",
	}
	if got := collect(t, r); !maps.Equal(got, want) {
		t.Fatalf("not serving: %s", diff(got, want))
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// newAdmission returns Admission instruments on a manual reader.
func newAdmission(t *testing.T) (*stormotel.Admission, *sdkmetric.ManualReader) {
	t.Helper()
	r, mp := newProvider(t)
	a, err := stormotel.NewAdmission(mp)
	if err != nil {
		t.Fatal(err)
	}
	return a, r
}
