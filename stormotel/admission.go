package stormotel

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/interceptor"
)

// The attribute keys of the admission instruments.
const (
	// ServerKey names the server whose admission limiter a gauge reports,
	// as given to Admission.Track.
	ServerKey = attribute.Key("stormguard.admission.server")
	// AdmissionReasonKey is why admission control refused a request:
	// "overload", "deadline", "limit", "caller_gone" or "queue_timeout".
	AdmissionReasonKey = attribute.Key("stormguard.admission.reason")
)

// Admission reports server-side admission control (interceptor.WithAdmission):
//
//	stormguard.admission.overloaded gauge    1 while the server is overloaded (arrivals exceed completions), per server
//	stormguard.admission.in_flight  gauge    requests admitted and not finished, per server
//	stormguard.admission.latency    gauge    s, the latency a new request can expect, per server
//	stormguard.admission.queue      gauge    requests waiting in the limiter's queue (admission.Config.QueueSize), per server
//	stormguard.admission.refusals   counter  requests refused before the handler, by reason
//	stormguard.health.serving       gauge    1 while the server's own state (interceptor.WithHealth) is SERVING, 0 while NOT_SERVING, per server; not what an operator set on the health server
//	stormguard.health.not_serving   counter  times the server said NOT_SERVING, per server
//
// The OTel Prometheus exporter names them stormguard_admission_overloaded,
// stormguard_admission_in_flight, stormguard_admission_latency_seconds,
// stormguard_admission_queue, stormguard_admission_refusals_total,
// stormguard_health_serving and stormguard_health_not_serving_total.
//
// Install it as an observer of the server interceptors, next to Metrics
// (interceptor.Observers(m, a)), and call Track for the gauges. It is safe
// for concurrent use; create it with NewAdmission, once per MeterProvider.
type Admission struct {
	over     metric.Int64ObservableGauge
	inflight metric.Int64ObservableGauge
	latency  metric.Float64ObservableGauge
	queue    metric.Int64ObservableGauge
	serving  metric.Int64ObservableGauge
	downs    metric.Int64ObservableCounter
	refusals metric.Int64Counter
	reg      metric.Registration
	reasons  [6]attrOpts // by interceptor.AdmissionReason; 0 is "other"

	mu      sync.Mutex
	servers []trackedServer
}

type trackedServer struct {
	name  string
	attrs metric.MeasurementOption
	l     *admission.Limiter // nil without WithAdmission
	s     *admission.Serving // nil without WithHealth
}

var _ interceptor.Observer = (*Admission)(nil)

// NewAdmission creates the admission instruments on a meter of mp named
// ScopeName; nil means the global MeterProvider.
func NewAdmission(mp metric.MeterProvider) (*Admission, error) {
	in := newInstruments(mp)
	a := &Admission{}
	a.over = in.intGauge("stormguard.admission.overloaded", "{state}",
		"1 while the server is overloaded (requests arrive faster than they complete) and sheds what would wait past its latency target, 0 otherwise, per server.")
	a.inflight = in.intGauge("stormguard.admission.in_flight", "{request}",
		"Requests admitted and not finished, per server.")
	a.latency = in.floatGauge("stormguard.admission.latency", "s",
		"The latency a new request can expect, per server: the recent successes' mean, or, while overloaded, suspect or through a hang below, (in flight + 1) x the time per completion of the last windows (admission.Limiter.Latency).")
	a.queue = in.intGauge("stormguard.admission.queue", "{request}",
		"Requests waiting in the admission limiter's queue, per server.")
	a.serving = in.intGauge("stormguard.health.serving", "{state}",
		"1 while the server's own state is SERVING, 0 while NOT_SERVING, from its own answers (interceptor.WithHealth), per server; not what an operator set on the health server.")
	a.downs = in.observableCounter("stormguard.health.not_serving", "{change}",
		"Times the server reported NOT_SERVING, per server.")
	a.refusals = in.counter("stormguard.admission.refusals", "{request}",
		"Requests refused by admission control before their handler, by reason.")
	if err := in.err(); err != nil {
		return nil, err
	}
	var err error
	for r, name := range []string{"other", "limit", "deadline", "caller_gone", "queue_timeout", "overload"} {
		a.reasons[r] = newAttrOpts(semconv.RPCSystemGRPC, AdmissionReasonKey.String(name))
	}
	a.reg, err = in.meter.RegisterCallback(a.collect, a.over, a.inflight, a.latency, a.queue, a.serving, a.downs)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Track reports the admission limiter and the health tracker of i (those
// it has) under the name server, from the next collection on. Nil
// interceptors, those with neither, and a server and interceptors already
// tracked are ignored.
func (a *Admission) Track(server string, i *interceptor.Interceptors) {
	if i == nil || i.Admission() == nil && i.Serving() == nil {
		return
	}
	t := trackedServer{name: server, attrs: metric.WithAttributes(ServerKey.String(server)), l: i.Admission(), s: i.Serving()}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.servers {
		if s.name == t.name && s.l == t.l && s.s == t.s {
			return
		}
	}
	a.servers = append(a.servers, t)
}

// Close unregisters the gauges' callback.
func (a *Admission) Close() error { return a.reg.Unregister() }

// Observe counts EventAdmissionRefused; it ignores the other events. It
// implements interceptor.Observer.
func (a *Admission) Observe(ctx context.Context, e interceptor.Event) {
	if e.Kind != interceptor.EventAdmissionRefused {
		return
	}
	r := int(e.Admission)
	if r < 0 || r >= len(a.reasons) {
		r = 0
	}
	a.refusals.Add(ctx, 1, a.reasons[r].add...)
}

func (a *Admission) collect(_ context.Context, o metric.Observer) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.servers {
		if s.l != nil {
			st := s.l.Stats()
			over := int64(0)
			if st.Overloaded {
				over = 1
			}
			o.ObserveInt64(a.over, over, s.attrs)
			o.ObserveInt64(a.inflight, int64(st.InFlight), s.attrs)
			o.ObserveFloat64(a.latency, st.Latency.Seconds(), s.attrs)
			o.ObserveInt64(a.queue, int64(st.Queue), s.attrs)
		}
		if s.s != nil {
			v := int64(0)
			if s.s.Serving() {
				v = 1
			}
			o.ObserveInt64(a.serving, v, s.attrs)
			o.ObserveInt64(a.downs, s.s.Downs(), s.attrs)
		}
	}
	return nil
}
