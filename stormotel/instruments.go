package stormotel

import (
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
)

// instruments creates instruments on stormguard's meter of a provider and
// collects their errors, so that a constructor lists its instruments and
// checks once.
type instruments struct {
	meter metric.Meter
	errs  []error
}

// newInstruments uses the meter of mp named ScopeName; a nil mp means the
// global MeterProvider.
func newInstruments(mp metric.MeterProvider) *instruments {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return &instruments{meter: mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))}
}

func (in *instruments) keep(err error) {
	if err != nil {
		in.errs = append(in.errs, err)
	}
}

// err is every error an instrument's creation returned, or nil.
func (in *instruments) err() error { return errors.Join(in.errs...) }

func (in *instruments) counter(name, unit, desc string) metric.Int64Counter {
	c, err := in.meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	in.keep(err)
	return c
}

func (in *instruments) histogram(name, unit, desc string, bounds []float64) metric.Float64Histogram {
	h, err := in.meter.Float64Histogram(name, metric.WithUnit(unit), metric.WithDescription(desc),
		metric.WithExplicitBucketBoundaries(bounds...))
	in.keep(err)
	return h
}

func (in *instruments) intHistogram(name, unit, desc string, bounds []float64) metric.Int64Histogram {
	h, err := in.meter.Int64Histogram(name, metric.WithUnit(unit), metric.WithDescription(desc),
		metric.WithExplicitBucketBoundaries(bounds...))
	in.keep(err)
	return h
}

func (in *instruments) intGauge(name, unit, desc string) metric.Int64ObservableGauge {
	g, err := in.meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	in.keep(err)
	return g
}

func (in *instruments) floatGauge(name, unit, desc string) metric.Float64ObservableGauge {
	g, err := in.meter.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	in.keep(err)
	return g
}

func (in *instruments) observableCounter(name, unit, desc string) metric.Int64ObservableCounter {
	c, err := in.meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	in.keep(err)
	return c
}
