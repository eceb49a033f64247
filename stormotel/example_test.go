package stormotel_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/stormotel"
)

// The wiring of one process with the recommended line: the three
// observers, and the interceptors tracked for the gauges. A Prometheus
// endpoint would use the OTel Prometheus exporter as the reader instead
// of the ManualReader.
func Example() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()

	m, err := stormotel.New(mp) // calls, retries, budgets
	if err != nil {
		panic(err)
	}
	am, err := stormotel.NewAdaptive(mp) // the adaptive throttle
	if err != nil {
		panic(err)
	}
	adm, err := stormotel.NewAdmission(mp) // admission control, health
	if err != nil {
		panic(err)
	}
	sg, err := interceptor.New(append(interceptor.Recommended(),
		interceptor.WithObserver(interceptor.Observers(m, am, adm)))...)
	if err != nil {
		panic(err)
	}
	m.TrackLimiters(sg)
	am.TrackThrottles(sg)
	adm.Track("payment", sg)
	// grpc.NewClient(target, sg.DialOptions()...) and
	// grpc.NewServer(sg.ServerOptions()...) would report their events;
	// here two are reported by hand.
	m.Observe(context.Background(), interceptor.Event{
		Kind: interceptor.EventRetryRefused, Method: "/shop.v1.Payment/Pay", Reason: interceptor.StopBudget,
	})
	am.Observe(context.Background(), interceptor.Event{Kind: interceptor.EventTargetDown, Target: "ledger:443"})

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
	// stormguard.adaptive.transitions stormguard.adaptive.down=true,stormguard.target=ledger:443 1
	// stormguard.admission.overloaded stormguard.admission.server=payment 0
	// stormguard.admission.in_flight stormguard.admission.server=payment 0
	// stormguard.admission.queue stormguard.admission.server=payment 0
}
