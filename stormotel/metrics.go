package stormotel

import (
	"context"
	"slices"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/capped"
)

// ScopeName is the instrumentation scope of the meter stormotel uses.
const ScopeName = "github.com/stormguard/stormguard/stormotel"

// MaxMethods is the number of distinct full methods a Metrics reports
// under their own names for the server instruments, and of distinct
// target and method pairs for the client instruments (each has its
// own); later ones are reported as rpc.method "_OTHER" (and
// stormguard.target "_OTHER").
const MaxMethods = 1024

// The attribute keys stormotel adds to the semantic conventions'.
const (
	// TargetKey is the key of a budget or breaker: the connection's
	// target (and method, with interceptor.WithPerMethodKeys).
	TargetKey = attribute.Key("stormguard.target")
	// ReasonKey is why a client did not retry; see the package doc for
	// the values.
	ReasonKey = attribute.Key("stormguard.reason")
	// ToStateKey is the state a breaker entered: "closed", "half_open"
	// or "open".
	ToStateKey = attribute.Key("stormguard.breaker.to_state")
	// HedgeKey is what became of a hedge: "sent", "won", "cancelled"
	// (an attempt cancelled because another answered) or "refused".
	HedgeKey = attribute.Key("stormguard.hedge")
)

// Breaker states as reported by stormguard.breaker.state, ordered by
// severity.
const (
	StateClosed   = 0
	StateHalfOpen = 1
	StateOpen     = 2
)

// Metrics is an interceptor.Observer that records the interceptors' events
// through the OpenTelemetry metric API, and reports the state of the
// breakers and retry limiters it tracks as observable gauges. See the
// package doc for the instruments.
//
// Install it with interceptor.WithObserver(m) on the client and server
// interceptors (New then reports the state changes of the breaker set
// given with WithBreaker too; interceptor.BreakerObserver(m) as a set's
// OnStateChange is only for a set used without New), then call
// TrackBreakers and TrackLimiters for the gauges. It is safe for concurrent use. Create it with New, once per
// MeterProvider: two on one provider would report the gauges twice.
type Metrics struct {
	attempts        metric.Int64Counter
	attemptDuration metric.Float64Histogram
	retries         metric.Int64Counter
	refusals        metric.Int64Counter
	retryDelay      metric.Float64Histogram
	serverAttempt   metric.Int64Histogram
	serverDepth     metric.Int64Histogram
	serverUpstream  metric.Int64Histogram
	pushbacks       metric.Int64Counter
	stacked         metric.Int64Counter
	hedges          metric.Int64Counter
	transitions     metric.Int64Counter
	breakerState    metric.Int64ObservableGauge
	budgetRatio     metric.Float64ObservableGauge
	throttleTokens  metric.Float64ObservableGauge
	reg             metric.Registration

	// The attributes of the server's full methods and of the client's
	// target and method pairs, capped apart, so that a client whose
	// targets churn leaves the server's names alone.
	server  capped.Map[string, *methodAttrs]
	client  capped.Map[attrKey, *methodAttrs]
	other   *methodAttrs // for client pairs past MaxMethods
	otherSv *methodAttrs // for server methods past MaxMethods
	targets targetAttrs  // for the breaker transitions

	trackMu  sync.Mutex // guards sets and limiters; held while collecting
	sets     []*breaker.Set
	limiters []*interceptor.Interceptors
}

var _ interceptor.Observer = (*Metrics)(nil)

// Histogram bucket boundaries, given to the SDK as advice (a View can
// override them).
var (
	// durationBounds are the semantic conventions' advice for RPC and
	// HTTP durations.
	durationBounds = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	delayBounds    = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	attemptBounds  = []float64{0, 1, 2, 3, 4, 5, 10}
	depthBounds    = []float64{0, 1, 2, 3, 4, 5, 6, 8, 10, 16, 32, 64}
	upstreamBounds = []float64{0, 1, 2, 3, 5, 10, 100}
)

// New creates the instruments on a meter of mp named ScopeName. A nil mp
// means the global MeterProvider (otel.GetMeterProvider). The error is the
// first one the meter returned for an instrument.
func New(mp metric.MeterProvider) (*Metrics, error) {
	in := newInstruments(mp)
	m := &Metrics{}
	m.attempts = in.counter("stormguard.client.attempts", "{attempt}",
		"Client attempts that ended, first calls and retries alike, by gRPC code.")
	m.attemptDuration = in.histogram("stormguard.client.attempt.duration", "s",
		"Duration of each client attempt.", durationBounds)
	m.retries = in.counter("stormguard.client.retries", "{retry}",
		"Retries the client scheduled.")
	m.refusals = in.counter("stormguard.client.retry.refusals", "{refusal}",
		"Retryable failures the client did not retry, by reason.")
	m.retryDelay = in.histogram("stormguard.client.retry.delay", "s",
		"Wait before each scheduled retry.", delayBounds)
	m.serverAttempt = in.intHistogram("stormguard.server.request.attempt", "{attempt}",
		"The caller's attempt index of each incoming request: 0 for a first call, 1 for the first retry.", attemptBounds)
	m.serverDepth = in.intHistogram("stormguard.server.request.depth", "{hop}",
		"Hops from the edge of each incoming request.", depthBounds)
	m.serverUpstream = in.intHistogram("stormguard.server.request.upstream_retries", "{retry}",
		"Retries in progress above this tier for each incoming request, the caller's included.", upstreamBounds)
	m.pushbacks = in.counter("stormguard.server.pushbacks", "{pushback}",
		"Answers sent with the do-not-retry trailer, by gRPC code.")
	m.stacked = in.counter("stormguard.server.stacked_retries", "{request}",
		"Requests whose caller runs grpc-go's built-in retry under a retrying client interceptor: the attempts multiply.")
	m.hedges = in.counter("stormguard.client.hedges", "{hedge}",
		"Hedges sent, won and refused, and attempts cancelled in flight when another answered (leads too: cancelled is not a part of sent).")
	m.transitions = in.counter("stormguard.breaker.transitions", "{transition}",
		"Circuit breaker state changes, by the state entered.")
	m.breakerState = in.intGauge("stormguard.breaker.state", "{state}",
		"Circuit breaker state per target: 0 closed, 1 half-open, 2 open.")
	m.budgetRatio = in.floatGauge("stormguard.budget.ratio", "1",
		"Retries per first attempt in the retry budget's current window, per target.")
	m.throttleTokens = in.floatGauge("stormguard.throttle.tokens", "{token}",
		"Tokens in the retry throttle, per target; retries are allowed above half of the capacity.")
	if err := in.err(); err != nil {
		return nil, err
	}
	var err error
	m.reg, err = in.meter.RegisterCallback(m.collect, m.breakerState, m.budgetRatio, m.throttleTokens)
	if err != nil {
		return nil, err
	}
	m.other = newMethodAttrs(otherValue, otherValue)
	m.otherSv = newMethodAttrs("", otherValue)
	return m, nil
}

// Close unregisters the gauges' callback: the tracked breakers and limiters
// are no longer read. Events are still recorded.
func (m *Metrics) Close() error { return m.reg.Unregister() }

// TrackBreakers reports the state of every breaker of sets in
// stormguard.breaker.state, from the next collection on. Nil sets and sets
// already tracked are ignored.
func (m *Metrics) TrackBreakers(sets ...*breaker.Set) {
	m.trackMu.Lock()
	defer m.trackMu.Unlock()
	m.sets = appendNew(m.sets, sets)
}

// TrackLimiters reports the retry budgets (stormguard.budget.ratio) and
// throttles (stormguard.throttle.tokens) of the interceptors is, per
// target, from the next collection on. Nil and already tracked
// interceptors are ignored.
func (m *Metrics) TrackLimiters(is ...*interceptor.Interceptors) {
	m.trackMu.Lock()
	defer m.trackMu.Unlock()
	m.limiters = appendNew(m.limiters, is)
}

// appendNew appends to s the values of vs that are neither zero (nil) nor
// in s already.
func appendNew[T comparable](s, vs []T) []T {
	var zero T
	for _, v := range vs {
		if v != zero && !slices.Contains(s, v) {
			s = append(s, v)
		}
	}
	return s
}

// Observe records e. It implements interceptor.Observer.
func (m *Metrics) Observe(ctx context.Context, e interceptor.Event) {
	switch e.Kind {
	case interceptor.EventAttemptEnd:
		a := m.attrs(e.Target, e.Method).code(e.Code)
		m.attempts.Add(ctx, 1, a.add...)
		m.attemptDuration.Record(ctx, e.Duration.Seconds(), a.rec...)
	case interceptor.EventRetryScheduled:
		a := &m.attrs(e.Target, e.Method).base
		m.retries.Add(ctx, 1, a.add...)
		m.retryDelay.Record(ctx, e.Delay.Seconds(), a.rec...)
	case interceptor.EventRetryRefused:
		a := &m.attrs(e.Target, e.Method).reasons[reasonIndex(e.Reason)]
		m.refusals.Add(ctx, 1, a.add...)
	case interceptor.EventRequestReceived:
		a := &m.attrs("", e.Method).base
		m.serverAttempt.Record(ctx, int64(e.Info.Attempt), a.rec...)
		m.serverDepth.Record(ctx, int64(e.Info.Depth), a.rec...)
		m.serverUpstream.Record(ctx, int64(e.Info.UpstreamRetries), a.rec...)
	case interceptor.EventPushbackSent:
		a := m.attrs("", e.Method).code(e.Code)
		m.pushbacks.Add(ctx, 1, a.add...)
	case interceptor.EventStackedRetry:
		a := &m.attrs("", e.Method).base
		m.stacked.Add(ctx, 1, a.add...)
	case interceptor.EventHedgeSent, interceptor.EventHedgeWon, interceptor.EventHedgeCancelled, interceptor.EventHedgeRefused:
		a := &m.attrs(e.Target, e.Method).hedges[e.Kind-interceptor.EventHedgeSent]
		m.hedges.Add(ctx, 1, a.add...)
	case interceptor.EventBreakerStateChange:
		// Rare: no cache of the attribute set, but a cap on the targets.
		m.transitions.Add(ctx, 1, metric.WithAttributes(m.targets.get(e.Target), ToStateKey.String(stateName(e.To))))
	}
}

// attrOpts holds one precomputed attribute set as ready-made option
// slices, so that recording allocates nothing: passing a fresh variadic
// slice through the API's interfaces would escape to the heap.
type attrOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newAttrOpts(kvs ...attribute.KeyValue) attrOpts {
	o := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return attrOpts{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}}
}

// numCodes is the number of gRPC codes with precomputed attributes.
const numCodes = int(codes.Unauthenticated) + 1

// otherValue replaces the target and method past MaxMethods pairs.
const otherValue = "_OTHER"

// attrKey is the key of an attribute cache entry: the client's target
// (empty for server events) and the full method.
type attrKey struct{ target, method string }

// methodAttrs are the attribute sets of one target and full method: rpc.*
// (and stormguard.target, for a client's), and those with each code and
// with each reason.
type methodAttrs struct {
	rpc     []attribute.KeyValue
	base    attrOpts
	codes   [numCodes]attrOpts
	reasons [numReasons]attrOpts
	hedges  [len(hedgeNames)]attrOpts // by Event.Kind - EventHedgeSent
}

// hedgeNames are the stormguard.hedge values, in the order of the hedge
// events.
var hedgeNames = [...]string{"sent", "won", "cancelled", "refused"}

// newMethodAttrs builds the attribute sets of fullMethod, with target as
// stormguard.target unless it is empty.
func newMethodAttrs(target, fullMethod string) *methodAttrs {
	rpc := []attribute.KeyValue{semconv.RPCSystemGRPC}
	if service, method, ok := splitMethod(fullMethod); ok {
		rpc = append(rpc, semconv.RPCService(service), semconv.RPCMethod(method))
	} else {
		rpc = append(rpc, semconv.RPCMethod(fullMethod))
	}
	if target != "" {
		rpc = append(rpc, TargetKey.String(target))
	}
	a := &methodAttrs{rpc: rpc, base: newAttrOpts(rpc...)}
	with := func(kv attribute.KeyValue) attrOpts {
		return newAttrOpts(append(rpc[:len(rpc):len(rpc)], kv)...)
	}
	for c := range a.codes {
		a.codes[c] = with(semconv.RPCGRPCStatusCodeKey.Int(c))
	}
	for r := range a.reasons {
		a.reasons[r] = with(ReasonKey.String(reasonNames[r]))
	}
	for h := range a.hedges {
		a.hedges[h] = with(HedgeKey.String(hedgeNames[h]))
	}
	return a
}

// code returns the attributes with code c; codes past Unauthenticated are
// not precomputed.
func (a *methodAttrs) code(c codes.Code) *attrOpts {
	if int(c) < numCodes {
		return &a.codes[c]
	}
	o := newAttrOpts(append(a.rpc[:len(a.rpc):len(a.rpc)], semconv.RPCGRPCStatusCodeKey.Int(int(c)))...)
	return &o
}

// splitMethod splits "/pkg.Service/Method" into "pkg.Service" and
// "Method"; ok is false when fullMethod has another shape.
func splitMethod(fullMethod string) (service, method string, ok bool) {
	s, found := strings.CutPrefix(fullMethod, "/")
	i := strings.LastIndexByte(s, '/')
	if !found || i <= 0 || i == len(s)-1 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// attrs returns the attribute sets of target (empty for server events)
// and fullMethod, creating them on first use.
func (m *Metrics) attrs(target, fullMethod string) *methodAttrs {
	if target == "" {
		return m.server.Add(fullMethod, MaxMethods, m.otherSv, func() *methodAttrs { return newMethodAttrs("", fullMethod) })
	}
	return m.client.Add(attrKey{target, fullMethod}, MaxMethods, m.other, func() *methodAttrs { return newMethodAttrs(target, fullMethod) })
}

// Reasons, as stormguard.reason values, indexed by reasonIndex.
const numReasons = 11

var reasonNames = [numReasons]string{
	"other", "not_retryable", "attempts", "budget", "breaker_open",
	"tier_policy", "pushback", "deadline", "canceled", "committed",
	"throttled",
}

func reasonIndex(r interceptor.StopReason) int {
	switch r {
	case interceptor.StopNotRetryable:
		return 1
	case interceptor.StopAttempts:
		return 2
	case interceptor.StopBudget:
		return 3
	case interceptor.StopBreakerOpen:
		return 4
	case interceptor.StopTierPolicy:
		return 5
	case interceptor.StopPushback:
		return 6
	case interceptor.StopDeadline:
		return 7
	case interceptor.StopCanceled:
		return 8
	case interceptor.StopCommitted:
		return 9
	case interceptor.StopThrottled:
		return 10
	}
	return 0
}

// stateValue maps a breaker state to the gauge's value.
func stateValue(s breaker.State) int64 {
	switch s {
	case breaker.Closed:
		return StateClosed
	case breaker.HalfOpen:
		return StateHalfOpen
	}
	return StateOpen // Open, and any unknown state: the safe side
}

func stateName(s breaker.State) string {
	switch s {
	case breaker.Closed:
		return "closed"
	case breaker.HalfOpen:
		return "half_open"
	case breaker.Open:
		return "open"
	}
	return "unknown"
}

// collect reports the gauges of the tracked breakers and limiters.
func (m *Metrics) collect(_ context.Context, o metric.Observer) error {
	m.trackMu.Lock()
	defer m.trackMu.Unlock()
	if len(m.sets) > 0 {
		states := map[string]int64{}
		for _, s := range m.sets {
			s.Range(func(key string, b *breaker.Breaker) bool {
				v := stateValue(b.State())
				if old, ok := states[key]; !ok || v > old {
					states[key] = v
				}
				return true
			})
		}
		for key, v := range states {
			o.ObserveInt64(m.breakerState, v, metric.WithAttributes(TargetKey.String(key)))
		}
	}
	if len(m.limiters) > 0 {
		ratios, tokens := map[string]float64{}, map[string]float64{}
		for _, i := range m.limiters {
			i.RangeLimiters(func(target string, l budget.Limiter) bool {
				s := l.Snapshot()
				if s.MaxTokens > 0 { // a throttle
					if old, ok := tokens[target]; !ok || s.Tokens < old {
						tokens[target] = s.Tokens
					}
				} else if old, ok := ratios[target]; !ok || s.Ratio > old {
					ratios[target] = s.Ratio
				}
				return true
			})
		}
		for target, v := range ratios {
			o.ObserveFloat64(m.budgetRatio, v, metric.WithAttributes(TargetKey.String(target)))
		}
		for target, v := range tokens {
			o.ObserveFloat64(m.throttleTokens, v, metric.WithAttributes(TargetKey.String(target)))
		}
	}
	return nil
}
