package dashboards

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/stormotel"
)

// exportAdmission adds the admission instruments to exported: a tracked
// limiter, and one request refused because its caller is gone.
func exportAdmission(t *testing.T, mp *sdkmetric.MeterProvider) {
	t.Helper()
	a, err := stormotel.NewAdmission(mp)
	if err != nil {
		t.Fatal(err)
	}
	i, err := interceptor.New(interceptor.WithAdmission(admission.Config{}), interceptor.WithObserver(a))
	if err != nil {
		t.Fatal(err)
	}
	a.Track("payment", i)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _ = i.UnaryServer()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/stormguard.testsvc.v1.TestService/Unary"},
		func(context.Context, any) (any, error) { return nil, nil })
	// A server with health, which said NOT_SERVING once.
	hs, err := interceptor.New(interceptor.WithHealth(health.NewServer(), admission.ServingConfig{}), interceptor.WithObserver(a))
	if err != nil {
		t.Fatal(err)
	}
	a.Track("order", hs)
	a.Observe(context.Background(), interceptor.Event{Kind: interceptor.EventNotServing})
}

// exportAdaptive records the adaptive throttle's instruments, with the
// gauges of Recommended()'s own set (tracked through the interceptors),
// and the health instruments.
func exportAdaptive(t *testing.T, mp *sdkmetric.MeterProvider) {
	t.Helper()
	am, err := stormotel.NewAdaptive(mp)
	if err != nil {
		t.Fatal(err)
	}
	i, err := interceptor.New(append(interceptor.Recommended(), interceptor.WithObserver(am))...)
	if err != nil {
		t.Fatal(err)
	}
	am.TrackThrottles(i)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, err := grpc.NewClient("passthrough:///payment", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// One answered call makes the target's throttle, for the gauges.
	_ = i.UnaryClient()(ctx, "/stormguard.testsvc.v1.TestService/Unary", nil, nil, cc,
		func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil })
	for _, k := range []interceptor.EventKind{interceptor.EventThrottled, interceptor.EventProbe, interceptor.EventTargetDown} {
		am.Observe(ctx, interceptor.Event{Kind: k, Target: "payment"})
	}
}
