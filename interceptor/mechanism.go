package interceptor

import (
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// attempt is one attempt of a call, with what the mechanisms keep for it
// until its outcome is reported. A call may have several in flight (a
// stream's attempt that a retry replaced, hedges): each holds its own
// permits.
type attempt struct {
	n        int32 // its index, 0 for the first (32 bits: the flags share its word)
	timedOut bool  // its own per-attempt timeout expired (unary)
	stream   bool  // a stream's attempt (see ending.stream)
	// mustReport: a mechanism holds a scarce slot for the attempt (a
	// half-open breaker's probe), so that a stream its caller abandons
	// must release it when the caller's context ends (see abandoner).
	mustReport bool
	started    time.Time // when it went out, when observed
	// answered: the target answered it (a stream's header or message),
	// so that running into the caller's deadline later is no hang.
	answered atomic.Bool
	brkDone  atomic.Bool // the breaker heard its outcome (a stream's probe hears early)
	thrDone  atomic.Bool // the throttle heard its outcome (a stream's answer is heard early)

	brk breaker.Permit
	thr adaptive.Permit
}

// mechanism is one per-target mechanism of a client call: a retry limiter
// (budget or A6 throttle), a circuit breaker, an adaptive throttle, the
// observer's events. The retry loop asks each in the order configured
// whether an attempt may go out, tells each (in reverse order) how it
// ended, and asks each whether the call may retry; it knows none of them.
type mechanism interface {
	// allow reports whether attempt a of c may go out: zero, or why the
	// call stops. Every attempt allowed by all is later told to done.
	allow(c *call, a *attempt) StopReason
	// done reports how a ended (once per attempt; outcomeNothing also
	// for an attempt a later mechanism refused).
	done(c *call, a *attempt, o outcome)
	// retry reports, before the wait, whether c may retry: zero, or why
	// it stops.
	retry(c *call) StopReason
}

// answerer is a mechanism that hears at once that a stream's target
// answered, long before the stream ends.
type answerer interface {
	answered(c *call, a *attempt)
}

// abandoner is a mechanism that holds a scarce slot for an attempt (a
// half-open breaker's probe), which must be released when a stream's
// caller abandons it, before its status is read.
type abandoner interface {
	abandoned(c *call, a *attempt, o outcome)
}

// maxMechanisms bounds the mechanisms of one call: a limiter, a breaker,
// a throttle and the observer.
const maxMechanisms = 4

// mechanismFor returns the mechanism of one kind for a target key, or nil.
type mechanismFor func(key string) mechanism

// buildMechanisms lists, in the order they are asked, the mechanisms
// that c configures: the throttle first (it may hold a first attempt
// while a target is down), then the breaker, then the retry limiter (a
// request counts in the budget only once it goes out), then the observer
// (an attempt is reported as started once it is).
func (c *config) buildMechanisms() {
	c.mechanisms = c.mechanisms[:0]
	if s := c.throttles; s != nil {
		c.mechanisms = append(c.mechanisms, func(key string) mechanism {
			if t := s.Get(key); t != nil {
				return (*throttleGuard)(t)
			}
			return nil
		})
	}
	if s := c.breakers; s != nil {
		c.mechanisms = append(c.mechanisms, func(key string) mechanism {
			if b := s.Get(key); b != nil {
				return (*breakerGuard)(b)
			}
			return nil
		})
	}
	if s := c.limiters; s != nil {
		c.mechanisms = append(c.mechanisms, func(key string) mechanism {
			if g := s.get(key); g != nil {
				return g
			}
			return nil
		})
	}
	if c.observer != nil {
		c.mechanisms = append(c.mechanisms, func(string) mechanism { return observerGuard{} })
	}
}

// breakerGuard is a target's circuit breaker as a mechanism.
type breakerGuard breaker.Breaker

func (g *breakerGuard) allow(_ *call, a *attempt) StopReason {
	p, err := (*breaker.Breaker)(g).Allow()
	if err != nil {
		return StopBreakerOpen
	}
	a.brk, a.mustReport = p, p.Probe()
	return 0
}

func (g *breakerGuard) done(_ *call, a *attempt, o outcome) {
	if a.brkDone.CompareAndSwap(false, true) {
		a.brk.Done(o.kind.forBreaker(a.brk.Probe()))
	}
}

// retry stops a call whose breaker is open: it would refuse the retry
// after the wait, so the budget is not spent on it. (A breaker whose
// open interval has passed still reads Open until a call's Allow moves
// it on; that call, not this retry, becomes the probe.)
func (g *breakerGuard) retry(*call) StopReason {
	if (*breaker.Breaker)(g).State() == breaker.Open {
		return StopBreakerOpen
	}
	return 0
}

// answered reports a half-open probe as a success as soon as the target
// answers, so that a long-lived stream does not hold one of the few probe
// slots for its whole life.
func (g *breakerGuard) answered(_ *call, a *attempt) {
	if a.brk.Probe() && a.brkDone.CompareAndSwap(false, true) {
		a.brk.Done(breaker.Success)
	}
}

// abandoned releases the permit of a stream that its caller left: a hang
// (its deadline expired before the target answered) is a failure, a
// cancel nothing. The outcome the stream reads later is not heard again.
func (g *breakerGuard) abandoned(c *call, a *attempt, o outcome) { g.done(c, a, o) }

// limiterGuard is a target's retry limiter (WithBudget, WithThrottle,
// WithLimiter) as a mechanism.
type limiterGuard struct{ budget.Limiter }

// allow records the request when its first attempt goes out, so that a
// call an open breaker refuses earns no retries.
func (g *limiterGuard) allow(_ *call, a *attempt) StopReason {
	if a.n == 0 {
		g.RecordRequest()
	}
	return 0
}

func (g *limiterGuard) done(_ *call, _ *attempt, o outcome) {
	if success, ok := o.forLimiter(); ok {
		g.RecordOutcome(success)
	}
}

// retry asks the limiter before the wait, so that a refusal reaches the
// user at once. A retry that then never goes out (the caller cancels, the
// breaker opens meanwhile) stays counted: the limiter errs towards fewer
// retries.
func (g *limiterGuard) retry(*call) StopReason {
	if !g.TryRetry() {
		return StopBudget
	}
	return 0
}

// observerGuard reports each attempt's start and end to the observer.
type observerGuard struct{}

func (observerGuard) allow(c *call, a *attempt) StopReason {
	a.started = time.Now()
	c.observe(Event{Kind: EventAttemptStart, Attempt: int(a.n)})
	return 0
}

func (observerGuard) done(c *call, a *attempt, o outcome) {
	c.observe(Event{Kind: EventAttemptEnd, Attempt: int(a.n), Code: o.code, Duration: time.Since(a.started)})
}

func (observerGuard) retry(*call) StopReason { return 0 }
