package interceptor

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/stormguard/stormguard/adaptive"
)

// WithAdaptive puts every attempt behind an adaptive throttle per target
// from set (see adaptive.Throttle): requests are shed in proportion to
// what the target accepts, retries go only to a healthy target, and a
// target that has accepted nothing for 50 ms while failing (eight times
// in a row, or once with its channel not ready) is down: only a few
// jittered probes reach it until one is answered, or until its channel,
// seen not ready meanwhile, is ready again. A refused attempt
// fails the call at once with codes.Unavailable (or, for a retry, the last
// attempt's code) and the "do not retry" mark. Nil turns it off. Client
// side.
//
// Overload outcomes are UNAVAILABLE, DEADLINE_EXCEEDED of the attempt's
// own timeout, and an attempt still unanswered when the caller's deadline
// expired (a hang). RESOURCE_EXHAUSTED counts for nothing: a quota far
// more often than an overload (one user over quota called a healthy
// target down for every other user when it counted), or a message too
// large. A refusal by the target's admission
// control (MetadataShed) is busy, not broken (adaptive.Busy): it counts as
// a request not accepted, which sheds only while the target accepts
// nothing (its refusals are cheap and carry pushback), and never towards
// calling it down.
// A "do not retry" answer comes from a live target whose own dependency
// failed and counts for nothing, except that it ends the down state when
// it answers a probe: the target answers, so it was down only because
// calls through it hung, as every tier of a chain sees a hang at its end.
// Every other answer is an accept.
//
// A first attempt refused because its target is down is held, up to
// adaptive.Config.Hold (250 ms) and within the caller's deadline, for
// the answer to the next probe: sent if it is answered (at the hold's
// end if the target was revived without an answer: its channel ready
// again), refused if it failed (a probe of any method: the services on
// one address share the target's throttle, see WithPerMethodKeys). A
// caller at a fixed concurrency waits instead of spinning on refusals of
// microseconds, and after an outage its requests go out instead of
// failing until the first probe or health trial. A caller of a target
// that stays down gets its error when the next probe fails (25-75 ms
// apart at high rates), or after the hold.
//
// While the throttle calls the target healthy (adaptive.Throttle.Healthy:
// up, accepting, at most this one failure since its last accept), the
// retry of a lone failure goes at once rather than after a backoff: the
// failure is a random one, and a caller with a fixed number of requests in
// flight would only idle through the wait (at 10 % random failures in a
// chain at capacity, the backoff cost 30 % of the goodput). The retry
// budget bounds these retries as any other; later retries, and retries of
// a target that fails more, wait their backoff.
//
// The recommended configuration, for every hop:
//
//	set, _ := adaptive.NewSet(adaptive.Config{}, 0)
//	interceptor.New(interceptor.WithAdaptive(set), interceptor.WithBudget(budget.Config{}))
//
// The budget bounds retries at random failures; the throttle handles
// outages, partial loss, hangs and recovery. A breaker in addition is not
// needed (it refuses capacity that a sick target still has).
func WithAdaptive(set *adaptive.Set) Option {
	return setupOption("WithAdaptive", func(c *config) error {
		c.throttles = set
		return nil
	})
}

// WithoutHold makes a first attempt refused because its target is down
// fail at once, as an open breaker's would, instead of waiting for the
// answer to the target's next probe (adaptive.Config.Hold, 25-75 ms at
// high rates, at most 250 ms): for a call the caller can do without,
// such as an optional branch of a fan-out, whose wait would add to every
// request for as long as the target is down (a user's trial: an
// aggregator whose optional dependency failed everything answered in
// 40-64 ms, 18-19 ms with retries off, and with WithoutHold on the
// optional call 18-19 ms). A call that needs the target gains from the
// hold: it goes out on a probe's answer when the target is back, where
// without it fails until the next probe, and a caller that sends its next
// request at once spins on refusals of microseconds. Client side; usable
// per call:
//
//	price, err := pricing.Quote(ctx, req, interceptor.WithoutHold())
func WithoutHold() Option {
	return Option{apply: func(c *config) error {
		c.noHold = true
		return nil
	}}
}

// AdaptiveObserver returns a function for adaptive.Config.OnDown that
// reports each change of a set's throttles to o as an EventTargetDown or
// EventTargetUp, with the throttle's key as Target.
//
// New needs no help: given both WithObserver and WithAdaptive, it reports
// the Set's changes to the observer itself, once per Set and observer.
// Use AdaptiveObserver only for a Set used without New, or for another
// observer than New's: wiring New's observer here as well reports each
// change twice.
func AdaptiveObserver(o Observer) func(name string, down bool) {
	return func(name string, down bool) {
		k := EventTargetUp
		if down {
			k = EventTargetDown
		}
		o.Observe(context.Background(), Event{Kind: k, Target: name})
	}
}

// wireAdaptiveObserver reports the down and up changes of cfg's throttle
// Set to cfg's observer, when both are set, keyed by the observer (see
// wireBreakerObserver).
func wireAdaptiveObserver(cfg *config) {
	if cfg.observer == nil || cfg.throttles == nil {
		return
	}
	for _, o := range listenerKeys(cfg.observer) {
		cfg.throttles.AddDownListener(o, AdaptiveObserver(o))
	}
}

// RangeThrottles calls f for each target's adaptive throttle until f
// returns false, for metrics such as the shedding probability.
func (i *Interceptors) RangeThrottles(f func(target string, t *adaptive.Throttle) bool) {
	if s := i.client.cfg.throttles; s != nil {
		s.Range(f)
	}
}

// connState is what the throttle reads of the call's channel.
type connState interface {
	GetState() connectivity.State
}

// throttleGuard is a target's adaptive throttle as a mechanism.
type throttleGuard adaptive.Throttle

func (g *throttleGuard) throttle() *adaptive.Throttle { return (*adaptive.Throttle)(g) }

// allow asks the throttle. A channel that broke while the target was down
// and is ready again revives it without waiting for a probe (idle and
// connecting say nothing: see reportConn); a first attempt refused
// because the target is down is held (see holdDown).
func (g *throttleGuard) allow(c *call, a *attempt) StopReason {
	t := g.throttle()
	retry := a.n > 0
	// The first attempt of a call for a trial, of this tier's admission
	// control or of one above, probes a down target without the probe
	// credit, which a tier that sees only trials gathers too slowly (see
	// adaptive.Throttle.AllowTrial).
	trial := !retry && c.servesTrial()
	ask := func() (adaptive.Permit, error) {
		if trial {
			return t.AllowTrialFor(c.method)
		}
		return t.AllowFor(retry, c.method)
	}
	p, err := ask()
	if errors.Is(err, adaptive.ErrDown) && c.conn != nil {
		reportConn(t, c.conn)
		if !t.Down() {
			p, err = ask()
		}
	}
	// Held: the target may be back; a trial refused for the probe
	// interval alone asks again anyway (the interval has likely passed).
	// A call that said WithoutHold is refused now.
	if errors.Is(err, adaptive.ErrDown) && !retry && !c.cfg.noHold {
		again := func() (adaptive.Permit, error) {
			if trial {
				return t.AllowTrialFor(c.method)
			}
			return t.AllowAgain(c.method)
		}
		if hp, herr, asked := c.holdDown(t, ask, again); asked {
			p, err = hp, herr
		} else if trial && c.ctx.Err() == nil {
			p, err = ask()
		}
	}
	if err != nil {
		if c.cfg.observer != nil {
			c.observe(Event{Kind: EventThrottled, Attempt: int(a.n), Probability: t.ProbabilityFor(c.method)})
		}
		return StopThrottled
	}
	if p.Probe() {
		c.observe(Event{Kind: EventProbe, Attempt: int(a.n)})
	}
	a.thr = p
	return 0
}

// done reports the outcome (see outcomeKind.forThrottle). Before an
// overload it tells the throttle whether the channel is connected. A
// "do not retry" answer to a probe revives a down target: it answers, so
// it was down only because calls through it hung (a hang below reaches
// every tier's caller at the same deadline); revived, it carries the
// traffic whose own probes find out when the tier below is back, where
// left down, the probes of each tier multiply (5 % of 5 % of 5 %) and a
// chain recovers from a hang only after seconds.
func (g *throttleGuard) done(c *call, a *attempt, o outcome) {
	t := g.throttle()
	if !a.thrDone.CompareAndSwap(false, true) {
		// A stream that answered: the throttle heard an accept then (see
		// answered). Its end, whatever it is, adds nothing.
		c.retryNow = false
		return
	}
	p := a.thr
	a.thr = adaptive.Permit{}
	to := o.kind.forThrottle()
	switch {
	case o.kind.revives() && p.Probe():
		t.Revive()
	case (to == adaptive.Overload || to == adaptive.Silence) && c.conn != nil:
		reportConn(t, c.conn)
	}
	p.Done(to)
	// Only a failure is retried: a success needs no look at the throttle.
	c.retryNow = c.attempt == 1 && o.kind != outcomeSuccess && t.HealthyFor(c.method)
}

// retry refuses a retry into a target that is not healthy, before the
// budget is spent and the wait begins.
func (g *throttleGuard) retry(c *call) StopReason {
	if !g.throttle().RetryAllowedFor(c.method) {
		return StopThrottled
	}
	return 0
}

// answered: a stream whose target answered (a header or a message) is
// an accept, at once, not when the stream ends: that may be never, or a
// cancel by its caller, which counts for nothing. Counted only at the
// end, the streams a client watches and cancels never told the throttle
// that the target serves, while its failed opens did, and a healthy
// streaming server was called down (a user's trial: after 3 failed opens
// among served streams). The accept revives a down target too.
func (g *throttleGuard) answered(_ *call, a *attempt) {
	if a.thrDone.CompareAndSwap(false, true) {
		p := a.thr
		a.thr = adaptive.Permit{}
		p.Done(adaptive.Accept)
	}
}

// holdDown holds a first attempt refused because its target is down, up
// to adaptive.Config.Hold and within the caller's deadline, until the
// target is back, or a probe failed (see adaptive.Config.Hold), asking
// once more when the next probe may go; it
// returns what the throttle answered the last time it asked, and asked
// false if it did not ask (Back closed with the target down, the hold
// ended with the target down, or the caller left). A caller
// at a fixed concurrency so waits instead of spinning on refusals, and
// after the outage its request goes out instead of failing before the
// first probe or health trial.
//
// A hold within the deadline ends holdMargin early (an eighth of the
// time left, at least 2 ms), so that the refusal reaches the callers
// above before their deadline, which is the same: held until it, every
// tier of the chain would fail with DEADLINE_EXCEEDED, and a caller with
// a deadline shorter than the hold would read a dead target as a slow one.
func (c *call) holdDown(t *adaptive.Throttle, ask, again func() (adaptive.Permit, error)) (p adaptive.Permit, err error, asked bool) {
	d := t.Hold()
	if dl, ok := c.ctx.Deadline(); ok {
		left := time.Until(dl)
		d = min(d, left-holdMargin(left))
	}
	if d <= 0 {
		return p, nil, false
	}
	back := t.Back()
	if due := t.ProbeIn(); due < d {
		// Until the next probe may go, then ask again (with no probe
		// credit of its own a second time): a caller of a fixed number,
		// all of whose requests are held, sends nothing else, and no
		// probe would go until the holds end (a user's trial: 32 callers
		// of an aggregator whose optional dependency was killed, held
		// 250 ms each, in step). Allowed, it goes as that probe;
		// refused, it waits on for the probe's answer, or for the end
		// of its hold. A
		// target revived by its connection alone is not asked: the
		// callers held meanwhile wait for an answer, as Back says, not
		// for the same instant.
		if c.cfg.hold(c.ctx, due, back) != nil {
			return p, nil, false
		}
		if c.conn != nil {
			reportConn(t, c.conn)
		}
		if isClosed(back) {
			if t.Down() {
				// A probe failed, or an answer came and the target
				// went down again.
				return p, nil, false
			}
			p, err = ask() // the target answered
			return p, err, true
		}
		if t.Down() {
			if p, err = again(); !errors.Is(err, adaptive.ErrDown) {
				return p, err, true
			}
		}
		d -= due
	}
	if d > 0 && c.cfg.hold(c.ctx, d, back) != nil {
		return p, nil, false
	}
	if c.conn != nil {
		reportConn(t, c.conn)
	}
	if t.Down() {
		return p, nil, false
	}
	p, err = ask()
	return p, err, true
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// holdMargin is how long before the caller's deadline, left away, a hold
// ends (see holdDown).
func holdMargin(left time.Duration) time.Duration {
	return max(2*time.Millisecond, left/8)
}

// holdCtx waits for d, back to close, or ctx to end, whichever comes
// first; it returns ctx's error if that ended it.
func holdCtx(ctx context.Context, d time.Duration, back <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-back:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// reportConn tells the throttle, before a failure is reported, whether
// the call's channel is connected. A failure with the channel broken (in
// transient failure: it could not connect, or the server's health check
// says it is not serving; or shut down) marks the target down at once,
// and the channel's coming back will say that the target is back. An
// idle or connecting channel says nothing either way: it has not tried
// to connect yet (a channel unused since its idle timeout, or one that a
// test's fake invoker never used), or is reconnecting after a lost
// connection, which usually takes milliseconds, and calls made meanwhile
// wait for it rather than fail.
func reportConn(t *adaptive.Throttle, conn connState) {
	switch conn.GetState() {
	case connectivity.Ready:
		t.Connectivity(true)
	case connectivity.TransientFailure, connectivity.Shutdown:
		t.Connectivity(false)
	}
}
