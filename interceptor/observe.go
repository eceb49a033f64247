package interceptor

import (
	"context"
	"reflect"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// EventKind says what an Event reports.
type EventKind int

// The events the interceptors report.
const (
	// EventAttemptStart: a client attempt is about to be sent (Attempt is
	// its index, 0 for the first).
	EventAttemptStart EventKind = iota + 1
	// EventAttemptEnd: a client attempt ended with Code after Duration
	// (for a stream: its whole life, or until it failed before its commit).
	EventAttemptEnd
	// EventRetryScheduled: the client will retry after Delay; Attempt is
	// the index of the retry.
	EventRetryScheduled
	// EventRetryRefused: the client stopped retrying a retryable failure
	// (Code) for Reason: attempts used up, budget, breaker open, tier
	// policy, pushback, deadline, the adaptive throttle (the target not
	// healthy before the wait, or a refusal after it), or a stream that
	// had committed. It also reports a call whose first attempt an open
	// breaker or the adaptive throttle refused (Attempt 0, Code
	// Unavailable, no attempt events before it; the throttle's refusals
	// are EventThrottled as well), and, with WithMaxAttempts(1), every
	// retryable failure. A caller that cancels is not reported.
	EventRetryRefused
	// EventRequestReceived: a server received a request; Info holds what
	// its metadata said (depth, the caller's attempt, upstream retries).
	EventRequestReceived
	// EventPushbackSent: a server answered "do not retry" with Code.
	EventPushbackSent
	// EventBreakerStateChange: the breaker for Target went From -> To.
	// New reports it when given both WithObserver and WithBreaker; for a
	// Set used without New, see BreakerObserver.
	EventBreakerStateChange
	// EventStackedRetry: a server received a request that carries both
	// stormguard's attempt metadata and grpc-previous-rpc-attempts, so the
	// caller runs grpc-go's built-in retry under a retrying client
	// interceptor, and the attempts multiply (see
	// Interceptors.UnaryClient). Method and Info as for
	// EventRequestReceived.
	EventStackedRetry
	// EventThrottled: the adaptive throttle refused attempt Attempt;
	// Probability is the shedding probability of the call's method at
	// its target (1 while the target is down; see
	// adaptive.Throttle.ProbabilityFor).
	EventThrottled
	// EventProbe: attempt Attempt goes to a down target as a probe.
	EventProbe
	// EventTargetDown, EventTargetUp: the adaptive throttle for Target
	// marked it down or back up. New reports them for the set given with
	// WithAdaptive (Recommended's too); for a set used without New, wire
	// AdaptiveObserver into adaptive.Config.OnDown.
	EventTargetDown
	EventTargetUp
	// EventAdmissionRefused: admission control (WithAdmission) refused a
	// request before its handler for Admission; Code is the answer's and
	// Delay the pushback sent (negative: "do not retry").
	EventAdmissionRefused
	// EventNotServing, EventServing: the server's own health (WithHealth)
	// became NOT_SERVING, or SERVING again to let a trial in (only a
	// trial does: admission.Serving); a trial whose requests are served
	// ends with no event, the server SERVING, and one that fails with
	// EventNotServing.
	EventNotServing
	EventServing
	// EventHedgeSent: a hedged call (WithHedging) sends hedge Attempt,
	// Delay after its last attempt went out with no answer yet.
	EventHedgeSent
	// EventHedgeWon: a hedge, Attempt, ended the call (with Code) before
	// an attempt sent earlier; only a success counts as a win for the
	// rule that stops hedges that lose (see WithHedging).
	EventHedgeWon
	// EventHedgeCancelled: the call cancelled its attempt Attempt, in
	// flight when another attempt answered.
	EventHedgeCancelled
	// EventHedgeRefused: a hedge due was not sent, for Reason (the
	// budget, the throttle, the breaker, the attempts, "do not retry");
	// the call sends no more hedges.
	EventHedgeRefused
)

var eventKindNames = map[EventKind]string{
	EventAttemptStart:       "attempt_start",
	EventAttemptEnd:         "attempt_end",
	EventRetryScheduled:     "retry_scheduled",
	EventRetryRefused:       "retry_refused",
	EventRequestReceived:    "request_received",
	EventPushbackSent:       "pushback_sent",
	EventBreakerStateChange: "breaker_state_change",
	EventStackedRetry:       "stacked_retry",
	EventThrottled:          "throttled",
	EventProbe:              "probe",
	EventTargetDown:         "target_down",
	EventTargetUp:           "target_up",
	EventAdmissionRefused:   "admission_refused",
	EventNotServing:         "not_serving",
	EventServing:            "serving",
	EventHedgeSent:          "hedge_sent",
	EventHedgeWon:           "hedge_won",
	EventHedgeCancelled:     "hedge_cancelled",
	EventHedgeRefused:       "hedge_refused",
}

func (k EventKind) String() string {
	if s, ok := eventKindNames[k]; ok {
		return s
	}
	return "unknown"
}

// Event is one thing that happened in an interceptor. Fields that do not
// apply to the Kind are zero.
type Event struct {
	Kind EventKind
	// Target is the key of the budget and breaker: the client
	// connection's target (and the method, WithPerMethodKeys).
	Target string
	// Method is the full gRPC method, "/package.Service/Method".
	Method string
	// Attempt is the attempt index (client events); for
	// EventRetryRefused, the number of attempts made.
	Attempt int
	// Code is the attempt's or the answer's code.
	Code codes.Code
	// Duration is how long the attempt took (EventAttemptEnd).
	Duration time.Duration
	// Delay is the wait before the retry (EventRetryScheduled) or the
	// hedge (EventHedgeSent).
	Delay time.Duration
	// Reason is why retrying stopped (EventRetryRefused).
	Reason StopReason
	// Info is the incoming request's metadata (EventRequestReceived), and
	// for client events, that of the request the call serves.
	Info Info
	// From and To are the breaker's states (EventBreakerStateChange).
	From, To breaker.State
	// Probability is the adaptive throttle's shedding probability of
	// the call's method (EventThrottled).
	Probability float64
	// Admission is why a request was refused (EventAdmissionRefused).
	Admission AdmissionReason
}

// Observer receives the interceptors' events, for metrics and logs. It is
// called on the RPC's goroutine, so it must be quick and safe for
// concurrent use, and it must not block. ctx is the RPC's context
// (context.Background for breaker changes).
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// Observers returns an Observer that passes every event to each of os in
// turn, for using several (metrics and logs) at once. Nil ones are left
// out.
func Observers(os ...Observer) Observer {
	m := &multiObserver{os: make([]Observer, 0, len(os))}
	for _, o := range os {
		if o != nil {
			m.os = append(m.os, o)
		}
	}
	return m
}

// multiObserver is a pointer, so that the Observer it makes is comparable
// (New keys the breaker listener by its observer). New keys the listeners
// by the observers inside it instead (see leaves): each call of Observers
// makes another pointer, and interceptors built with Observers(m, am)
// again and again would report each change once per New.
type multiObserver struct{ os []Observer }

// listenerKeys returns the observers to register a set's listener for,
// each keyed by itself: those inside an Observers value, so that one
// made afresh for each New reports a change once; or o itself when one
// of them cannot be told apart from another (a func: an Observers value
// shared by every New then reports a change once, one made afresh once
// per New, as before).
func listenerKeys(o Observer) []Observer {
	ls := leaves(o, nil)
	for _, l := range ls {
		if !reflect.ValueOf(l).Comparable() {
			return []Observer{o}
		}
	}
	return ls
}

// leaves returns the observers o passes events to, nil ones left out: o,
// or those inside an Observers value, recursively.
func leaves(o Observer, into []Observer) []Observer {
	m, ok := o.(*multiObserver)
	if !ok || m == nil {
		if o == nil {
			return into
		}
		return append(into, o)
	}
	for _, o := range m.os {
		into = leaves(o, into)
	}
	return into
}

func (m *multiObserver) Observe(ctx context.Context, e Event) {
	for _, o := range m.os {
		o.Observe(ctx, e)
	}
}

// WithObserver reports events to o. Without it the interceptors report
// nothing, at no cost. Client and server side.
//
// Give a comparable observer, such as a pointer (stormotel's and
// stormslog's are), or an Observers value: New reports the changes of a
// breaker or throttle set once per observer, however many interceptors
// are built from the set. An observer that cannot be compared (a func
// type, or a struct holding one) gets them once per New.
//
// WithObserver(nil) means none. A nil pointer or func (a typed nil, such
// as a *stormotel.Metrics never assigned), given alone or inside
// Observers, makes New fail.
func WithObserver(o Observer) Option {
	return setupOption("WithObserver", func(c *config) error {
		for _, l := range leaves(o, nil) {
			if isNil(l) {
				return invalid("WithObserver: a nil %T", l)
			}
		}
		c.observer = o
		return nil
	})
}

// BreakerObserver returns a function for breaker.Config.OnStateChange that
// reports each state change of the set's breakers to o as an
// EventBreakerStateChange, with the breaker's key as Target.
//
// New needs no help: given both WithObserver and WithBreaker, it reports
// the Set's changes to the observer itself (once per Set and observer,
// however many interceptors are built from them; a Config.OnStateChange
// of your own keeps being called). Use BreakerObserver only for a Set
// used without New, or for another observer than New's: wiring New's
// observer here as well reports each change twice.
func BreakerObserver(o Observer) func(name string, from, to breaker.State) {
	return func(name string, from, to breaker.State) {
		o.Observe(context.Background(), Event{Kind: EventBreakerStateChange, Target: name, From: from, To: to})
	}
}

// wireBreakerObserver reports the breaker changes of cfg's Set to cfg's
// observer, when both are set. The listener is keyed by the observer (by
// each of the observers inside Observers), so that the interceptors New
// builds again and again from one Set and one observer (unary and
// stream, client and server, one per connection) report each change
// once.
func wireBreakerObserver(cfg *config) {
	if cfg.observer == nil || cfg.breakers == nil {
		return
	}
	for _, o := range listenerKeys(cfg.observer) {
		cfg.breakers.AddStateListener(o, BreakerObserver(o))
	}
}

// RangeLimiters calls f for each target's retry limiter (WithBudget,
// WithThrottle or WithLimiter) until f returns false, for metrics such as
// the budget's ratio per target.
func (i *Interceptors) RangeLimiters(f func(target string, l budget.Limiter) bool) {
	if s := i.client.cfg.limiters; s != nil {
		s.Range(f)
	}
}

// observe reports e when an observer is set.
func (c *call) observe(e Event) {
	if o := c.cfg.observer; o != nil {
		e.Target, e.Method, e.Info = c.key, c.method, c.info
		o.Observe(c.ctx, e)
	}
}
