package stormotel_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/stormotel"
)

// The wiring of one process. A Prometheus endpoint would use the OTel
// Prometheus exporter as the reader instead of the ManualReader.
func Example() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()

	m, err := stormotel.New(mp)
	if err != nil {
		panic(err)
	}
	breakers, err := breaker.NewSet(breaker.Config{}, 0) // New reports its changes to m
	if err != nil {
		panic(err)
	}
	ic, err := interceptor.New(interceptor.WithObserver(m), interceptor.WithBreaker(breakers),
		interceptor.WithBudget(budget.Config{}))
	if err != nil {
		panic(err)
	}
	m.TrackBreakers(breakers)
	m.TrackLimiters(ic)
	// grpc.NewClient(target, ic.DialOptions()...) and
	// grpc.NewServer(ic.ServerOptions()...) would report their events;
	// here one is reported by hand, and a breaker is created.
	m.Observe(context.Background(), interceptor.Event{
		Kind: interceptor.EventRetryRefused, Method: "/shop.v1.Payment/Pay", Reason: interceptor.StopBudget,
	})
	breakers.Get("dns:///payment")

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, met := range sm.Metrics {
			switch d := met.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					fmt.Println(met.Name, p.Attributes.Encoded(attribute.DefaultEncoder()), p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					fmt.Println(met.Name, p.Attributes.Encoded(attribute.DefaultEncoder()), p.Value)
				}
			}
		}
	}
	// Output:
	// stormguard.client.retry.refusals rpc.method=Pay,rpc.service=shop.v1.Payment,rpc.system=grpc,stormguard.reason=budget 1
	// stormguard.breaker.state stormguard.target=dns:///payment 0
}
