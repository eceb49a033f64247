package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/stormotel"
)

// telemetry connects a tier's interceptors and breakers to stormotel,
// and in process to a scenario's own observer. A nil *telemetry does
// nothing: the in-process demo runs without metrics.
type telemetry struct {
	metrics   *stormotel.Metrics         // nil: none
	adaptive  *stormotel.AdaptiveMetrics // with metrics
	admission *stormotel.Admission       // with metrics
	tier      string                     // the server's name on the admission gauges
	observer  interceptor.Observer       // nil: none; the busy scenarios' counts
}

func (tm *telemetry) options() []interceptor.Option {
	if tm == nil {
		return nil
	}
	var os []interceptor.Observer
	if tm.metrics != nil {
		os = append(os, tm.metrics, tm.adaptive, tm.admission)
	}
	if tm.observer != nil {
		os = append(os, tm.observer)
	}
	switch len(os) {
	case 0:
		return nil
	case 1:
		return []interceptor.Option{interceptor.WithObserver(os[0])}
	}
	return []interceptor.Option{interceptor.WithObserver(interceptor.Observers(os...))}
}

func (tm *telemetry) breakerConfig() breaker.Config {
	if tm == nil {
		return breaker.Config{}
	}
	// The interceptors built with WithObserver(tm.metrics) report the
	// set's state changes; nothing to wire here.
	return breaker.Config{}
}

func (tm *telemetry) trackBreakers(s *breaker.Set) {
	if tm != nil && tm.metrics != nil {
		tm.metrics.TrackBreakers(s)
	}
}

// track reports ic's budgets, throttles and admission limiter in the
// gauges.
func (tm *telemetry) track(ic *interceptor.Interceptors) {
	if tm != nil && tm.metrics != nil {
		tm.metrics.TrackLimiters(ic)
		tm.adaptive.TrackThrottles(ic)
		tm.admission.Track(tm.tier, ic)
	}
}

// serveMetrics serves the Prometheus text format at http://addr/metrics,
// from an OpenTelemetry SDK whose reader is the OTel Prometheus exporter:
// the library speaks the OTel API only, and the exporter is the bridge that
// OTel maintains, so the names are the ones the dashboard in dashboards/
// expects. addr must be a loopback address. It returns the telemetry to
// wire into the tier, the address it listens on, and a stop function.
func serveMetrics(addr, tier string, stderr io.Writer) (*telemetry, net.Addr, func(), error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--metrics %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, nil, nil, fmt.Errorf("--metrics %q: want a loopback address such as 127.0.0.1:9090", addr)
	}
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	tm := &telemetry{tier: tier}
	if tm.metrics, err = stormotel.New(mp); err != nil {
		return nil, nil, nil, err
	}
	if tm.adaptive, err = stormotel.NewAdaptive(mp); err != nil {
		return nil, nil, nil, err
	}
	if tm.admission, err = stormotel.NewAdmission(mp); err != nil {
		return nil, nil, nil, err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(stderr, "stormsim: metrics:", err)
		}
	}()
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = tm.metrics.Close()
		_ = tm.adaptive.Close()
		_ = tm.admission.Close()
		_ = mp.Shutdown(ctx)
	}
	return tm, lis.Addr(), stop, nil
}
