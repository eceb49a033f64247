package busy

import (
	"context"
	"maps"
	"sync/atomic"

	"github.com/stormguard/stormguard/interceptor"
)

// Counts are one tier process's counters since it started: what reached
// it, and the refusals and "down" events of its stormguard interceptors
// (all zero for a stack that is not stormguard's: nothing reports them).
// The JSON of the tier's stats endpoint.
type Counts struct {
	Tier string `json:"tier"`
	// Stormguard is true when an observer counted the events below.
	Stormguard bool `json:"stormguard"`
	// Received: unary calls that reached the server, before any
	// interceptor. Handled: those that reached the handler (past
	// admission control). OK: those the tier answered OK.
	Received int64 `json:"received"`
	Handled  int64 `json:"handled"`
	OK       int64 `json:"ok"`
	// Sent: attempts the tier's client sent to the next tier (after its
	// retry interceptors: every attempt).
	Sent int64 `json:"sent"`

	// Admission: requests admission control refused, by
	// interceptor.AdmissionReason.
	Admission map[string]int64 `json:"admission_refused,omitempty"`
	// Throttled: attempts the adaptive throttle refused (EventThrottled).
	Throttled int64 `json:"throttled"`
	// RetryRefused: EventRetryRefused by interceptor.StopReason.
	RetryRefused map[string]int64 `json:"retry_refused,omitempty"`
	// Retries: retries scheduled (EventRetryScheduled).
	Retries int64 `json:"retries"`
	// TargetDown: the adaptive throttle marked a target down;
	// NotServing: the server's own health went NOT_SERVING.
	TargetDown int64 `json:"target_down"`
	TargetUp   int64 `json:"target_up"`
	NotServing int64 `json:"not_serving"`
	Serving    int64 `json:"serving"`

	// CPU: the process's CPU time (user and system) in nanoseconds, a
	// steadier measure of what a stack costs than goodput on a shared
	// machine.
	CPU int64 `json:"cpu_ns"`
}

// The refusals the issue counts: "any attempt stormguard declined
// (admission shed, throttle refusal, retry denied)".

// AdmissionRefused returns the requests admission control refused.
func (c Counts) AdmissionRefused() int64 { return sum(c.Admission) }

// RetryDenied returns the retries refused by the budget or the adaptive
// throttle. The library reports an attempt the throttle refused twice,
// as EventThrottled and then as the call's EventRetryRefused with
// StopThrottled (interceptor/adaptive.go, admitAdaptive): those are
// counted once, as Throttled.
func (c Counts) RetryDenied() int64 {
	budget := c.RetryRefused[interceptor.StopBudget.String()]
	thr := c.RetryRefused[interceptor.StopThrottled.String()]
	return budget + max(0, thr-c.Throttled)
}

// Refusals returns every attempt stormguard declined.
func (c Counts) Refusals() int64 { return c.AdmissionRefused() + c.Throttled + c.RetryDenied() }

// Downs returns the "down" events: targets marked down and the server
// saying NOT_SERVING.
func (c Counts) Downs() int64 { return c.TargetDown + c.NotServing }

// Sub returns c minus an earlier snapshot of the same tier.
func (c Counts) Sub(o Counts) Counts {
	return c.combine(o, -1)
}

// Add returns the sum of two tiers' counts (Tier is c's).
func (c Counts) Add(o Counts) Counts { return c.combine(o, 1) }

func (c Counts) combine(o Counts, sign int64) Counts {
	r := c
	r.Stormguard = c.Stormguard || o.Stormguard
	r.Received += sign * o.Received
	r.Handled += sign * o.Handled
	r.OK += sign * o.OK
	r.Sent += sign * o.Sent
	r.Throttled += sign * o.Throttled
	r.Retries += sign * o.Retries
	r.TargetDown += sign * o.TargetDown
	r.TargetUp += sign * o.TargetUp
	r.NotServing += sign * o.NotServing
	r.Serving += sign * o.Serving
	r.CPU += sign * o.CPU
	r.Admission = combineMaps(c.Admission, o.Admission, sign)
	r.RetryRefused = combineMaps(c.RetryRefused, o.RetryRefused, sign)
	return r
}

func combineMaps(a, b map[string]int64, sign int64) map[string]int64 {
	if len(a) == 0 && len(b) == 0 {
		return nil
	}
	r := maps.Clone(a)
	if r == nil {
		r = map[string]int64{}
	}
	for k, v := range b {
		r[k] += sign * v
		if r[k] == 0 {
			delete(r, k)
		}
	}
	if len(r) == 0 {
		return nil
	}
	return r
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// maxReason bounds the reason codes counted one by one; a larger one
// (a reason added to the library later) is counted in the last slot.
const maxReason = 32

// counter is the tier's interceptor.Observer: atomics only, since it is
// called on every RPC's goroutine.
type counter struct {
	admission    [maxReason]atomic.Int64 // by interceptor.AdmissionReason
	retryRefused [maxReason]atomic.Int64 // by interceptor.StopReason
	throttled    atomic.Int64
	retries      atomic.Int64
	down, up     atomic.Int64
	notServing   atomic.Int64
	serving      atomic.Int64
}

func slot(i int) int { return min(max(i, 0), maxReason-1) }

func (c *counter) Observe(_ context.Context, e interceptor.Event) {
	switch e.Kind {
	case interceptor.EventAdmissionRefused:
		c.admission[slot(int(e.Admission))].Add(1)
	case interceptor.EventThrottled:
		c.throttled.Add(1)
	case interceptor.EventRetryRefused:
		c.retryRefused[slot(int(e.Reason))].Add(1)
	case interceptor.EventRetryScheduled:
		c.retries.Add(1)
	case interceptor.EventTargetDown:
		c.down.Add(1)
	case interceptor.EventTargetUp:
		c.up.Add(1)
	case interceptor.EventNotServing:
		c.notServing.Add(1)
	case interceptor.EventServing:
		c.serving.Add(1)
	}
}

// fill copies the counter into c.
func (c *counter) fill(r *Counts) {
	r.Admission = reasons(&c.admission, func(i int) string { return interceptor.AdmissionReason(i).String() })
	r.RetryRefused = reasons(&c.retryRefused, func(i int) string { return interceptor.StopReason(i).String() })
	r.Throttled = c.throttled.Load()
	r.Retries = c.retries.Load()
	r.TargetDown, r.TargetUp = c.down.Load(), c.up.Load()
	r.NotServing, r.Serving = c.notServing.Load(), c.serving.Load()
}

func reasons(a *[maxReason]atomic.Int64, name func(int) string) map[string]int64 {
	m := map[string]int64{}
	for i := range a {
		if n := a[i].Load(); n != 0 {
			m[name(i)] += n
		}
	}
	return m
}
