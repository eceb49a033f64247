package dashboards

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"

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
}
