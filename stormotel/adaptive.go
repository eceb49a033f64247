package stormotel

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/interceptor"
)

// DownKey says whether a target's adaptive throttle marked it down (true)
// or back up (false), on stormguard.adaptive.transitions.
const DownKey = attribute.Key("stormguard.adaptive.down")

// AdaptiveMetrics is an interceptor.Observer for the adaptive throttle's
// decisions (interceptor.WithAdaptive), next to Metrics, which records
// everything else:
//
//   - stormguard.adaptive.refusals (counter, {attempt}): attempts the
//     throttle refused as they were about to go out (EventThrottled:
//     shed, or a down target), by stormguard.target. Each (a hedge's
//     aside, a refused hedge) is also one of Metrics'
//     stormguard.client.retry.refusals with reason "throttled",
//     which counts besides the retries the throttle refused earlier,
//     before the wait, because the target was not healthy: do not add
//     the two.
//   - stormguard.adaptive.probes (counter, {attempt}): attempts sent to a
//     down target as probes, by stormguard.target.
//   - stormguard.adaptive.transitions (counter, {transition}): targets
//     marked down or back up, by stormguard.target and
//     stormguard.adaptive.down.
//   - stormguard.adaptive.rejection_probability (gauge, 1): each tracked
//     throttle's shedding probability, 1 while its target is down.
//   - stormguard.adaptive.down (gauge, {state}): 1 while the target is
//     down, else 0: the throttle's state as it is, which a health trial
//     revives for the trial (transitions count the changes OnDown
//     reports, an up once an answer confirms it).
//
// The OTel Prometheus exporter names them stormguard_adaptive_refusals_total,
// stormguard_adaptive_probes_total, stormguard_adaptive_transitions_total,
// stormguard_adaptive_rejection_probability_ratio and
// stormguard_adaptive_down.
//
// Install it with interceptor.WithObserver(interceptor.Observers(m, am))
// (New then reports the down and up changes of the set given with
// WithAdaptive too; interceptor.AdaptiveObserver(am) as
// adaptive.Config.OnDown is only for a set used without New), and call
// TrackThrottles (or Track, for a set of your own) for the gauges. Targets are attribute values: the counters
// report at most MaxTargets of them (then "_OTHER"), the gauges those
// the tracked sets hold (adaptive.Set holds at most its maxKeys).
type AdaptiveMetrics struct {
	refusals, probes, transitions metric.Int64Counter
	probability                   metric.Float64ObservableGauge
	down                          metric.Int64ObservableGauge
	reg                           metric.Registration

	mu      sync.Mutex
	sets    []*adaptive.Set
	ics     []*interceptor.Interceptors
	targets targetAttrs
}

// NewAdaptive creates the instruments on a meter of mp named ScopeName; a
// nil mp means the global MeterProvider.
func NewAdaptive(mp metric.MeterProvider) (*AdaptiveMetrics, error) {
	in := newInstruments(mp)
	m := &AdaptiveMetrics{}
	m.refusals = in.counter("stormguard.adaptive.refusals", "{attempt}",
		"Attempts the adaptive throttle refused as they were about to go out: shed, or a down target.")
	m.probes = in.counter("stormguard.adaptive.probes", "{attempt}",
		"Attempts sent to a down target as probes.")
	m.transitions = in.counter("stormguard.adaptive.transitions", "{transition}",
		"Targets the adaptive throttle marked down or back up.")
	m.probability = in.floatGauge("stormguard.adaptive.rejection_probability", "1",
		"The adaptive throttle's shedding probability per target; 1 while the target is down.")
	m.down = in.intGauge("stormguard.adaptive.down", "{state}",
		"1 while the adaptive throttle holds the target down, else 0.")
	if err := in.err(); err != nil {
		return nil, err
	}
	var err error
	m.reg, err = in.meter.RegisterCallback(m.collect, m.probability, m.down)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Close unregisters the gauges' callback.
func (m *AdaptiveMetrics) Close() error { return m.reg.Unregister() }

// Track reports the throttles of sets in the gauges from the next
// collection on. Nil sets and sets already tracked are ignored.
func (m *AdaptiveMetrics) Track(sets ...*adaptive.Set) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sets = appendNew(m.sets, sets)
}

// TrackThrottles reports the throttles of the interceptors is (their
// WithAdaptive set, Recommended's too, whose set is made inside it) in
// the gauges from the next collection on. Nil interceptors and ones
// already tracked are ignored.
func (m *AdaptiveMetrics) TrackThrottles(is ...*interceptor.Interceptors) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ics = appendNew(m.ics, is)
}

// Observe records the adaptive throttle's events and ignores the others.
// It implements interceptor.Observer.
func (m *AdaptiveMetrics) Observe(ctx context.Context, e interceptor.Event) {
	switch e.Kind {
	case interceptor.EventThrottled:
		m.refusals.Add(ctx, 1, metric.WithAttributes(m.targets.get(e.Target)))
	case interceptor.EventProbe:
		m.probes.Add(ctx, 1, metric.WithAttributes(m.targets.get(e.Target)))
	case interceptor.EventTargetDown, interceptor.EventTargetUp:
		m.transitions.Add(ctx, 1, metric.WithAttributes(m.targets.get(e.Target), DownKey.Bool(e.Kind == interceptor.EventTargetDown)))
	}
}

func (m *AdaptiveMetrics) collect(_ context.Context, o metric.Observer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	// A throttle reached twice (its set tracked, and interceptors built
	// from it) is reported once.
	seen := make(map[*adaptive.Throttle]bool)
	observe := func(key string, t *adaptive.Throttle) bool {
		if seen[t] {
			return true
		}
		seen[t] = true
		st := t.Stats()
		attrs := metric.WithAttributes(TargetKey.String(key))
		o.ObserveFloat64(m.probability, st.Probability, attrs)
		var d int64
		if st.Down {
			d = 1
		}
		o.ObserveInt64(m.down, d, attrs)
		return true
	}
	for _, s := range m.sets {
		s.Range(observe)
	}
	for _, i := range m.ics {
		i.RangeThrottles(observe)
	}
	return nil
}
