package interceptor

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// UnaryClientInterceptor returns the retrying client interceptor for
// unary calls. Use it with grpc.WithDisableRetry (DialOptions does both):
// with grpc.WithChainUnaryInterceptor alone, a service config retry
// policy stays on underneath and multiplies its attempts unseen (3 x 3 = 9
// calls where 3 were meant; see Interceptors.UnaryClient).
//
// As gRFC A6 prescribes, an attempt whose response headers arrived
// commits the call: it is not retried, whatever status follows (the
// server may have acted on the request). A failure before any header (a
// trailers-only response) is retried.
//
// What the breaker and the budget count: an attempt that ends with
// UNAVAILABLE or RESOURCE_EXHAUSTED, or with DEADLINE_EXCEEDED of its own
// per-attempt timeout, is a failure; so is one still running when the
// caller's deadline expires, since a hang is the most expensive failure
// a target has. An attempt whose caller cancels it counts for nothing. A
// call cancelled while it waits to retry ends with codes.Canceled (or
// DeadlineExceeded), and errors.Is matches context.Canceled (or
// context.DeadlineExceeded), as with grpc-go's own retry.
//
// Invalid options cannot be reported from here; the interceptor then fails
// every call with codes.Internal and the reason. Use New to get the error
// at start-up instead.
func UnaryClientInterceptor(opts ...Option) grpc.UnaryClientInterceptor {
	i, err := New(opts...)
	if err != nil {
		return func(context.Context, string, any, any, *grpc.ClientConn, grpc.UnaryInvoker, ...grpc.CallOption) error {
			return status.Error(codes.Internal, err.Error())
		}
	}
	return i.UnaryClient()
}

// client holds the configuration of one client interceptor.
type client struct {
	cfg config
	// last is the normalized target of the last connection seen: one
	// interceptor usually serves one connection, whose target does not
	// change, so the key is computed once, not on every call.
	last atomic.Pointer[connTarget]
}

type connTarget struct {
	cc     *grpc.ClientConn
	target string // normalized
}

// target returns the normalized target of cc (see normalizeTarget).
func (cl *client) target(cc *grpc.ClientConn) string {
	if t := cl.last.Load(); t != nil && t.cc == cc {
		return t.target
	}
	t := &connTarget{cc: cc, target: normalizeTarget(cc.Target())}
	cl.last.Store(t)
	return t.target
}

// callConfig returns the configuration for one call: the interceptor's,
// or a copy with the call's own Options applied (see config.forCall).
func (cl *client) callConfig(opts []grpc.CallOption) (*config, error) {
	return cl.cfg.forCall(opts)
}

// call is the retry state of one client call, shared by the unary and
// stream interceptors: which attempt this is, what the tier policy, the
// budget and the breaker say, and the last error.
type call struct {
	ctx     context.Context // the caller's
	cfg     *config
	st      *serverState // the request this call serves, if any
	info    Info
	target  string
	method  string
	key     string // of the budget and breaker
	lim     budget.Limiter
	brk     *breaker.Breaker
	thr     *adaptive.Throttle // WithAdaptive
	conn    connState          // the call's channel, for the throttle
	tp      adaptive.Permit    // of the attempt in flight
	max     int                // attempts allowed for this call, after the tier policy
	attempt int                // attempts made so far
	prev    time.Duration
	last    error
	started time.Time // of the current attempt, when observed
	// timedOut: the last attempt's own per-attempt timeout expired (unary
	// only; see ownTimeout), which alone makes DeadlineExceeded retryable.
	timedOut bool
	// committed: the call can no longer be retried (gRFC A6): response
	// headers or a message arrived, or a stream outgrew its replay buffer.
	committed bool
	// answered: a stream's target answered (a header or a message), so
	// that running into the caller's deadline later is no sign of a hang.
	answered atomic.Bool
}

// retryable reports whether an attempt that ended with code may be
// retried: a configured code, or DeadlineExceeded from the attempt's own
// timeout.
func (c *call) retryable(code codes.Code) bool {
	if code == codes.DeadlineExceeded {
		return c.timedOut
	}
	return c.cfg.retries(code)
}

// init prepares c for a call to method of target (normalized: one key
// for every spelling of an address). The request is recorded
// in the budget when its first attempt goes out (attemptContext), so that a
// call an open breaker refuses does not earn retries.
func (c *call) init(ctx context.Context, cfg *config, target, method string) {
	*c = call{ctx: ctx, cfg: cfg, target: target, method: method, st: stateFrom(ctx)}
	if c.st != nil {
		c.info = c.st.Info()
	}
	c.max = max(1, min(cfg.policy(c.info, cfg.maxAttempts), cfg.maxAttempts))
	c.key = target
	if cfg.perMethod {
		c.key = methodKey(target, method)
	}
	if cfg.limiters != nil {
		c.lim = cfg.limiters.get(c.key)
	}
	if cfg.breakers != nil {
		c.brk = cfg.breakers.Get(c.key)
	}
	c.initAdaptive()
}

// admit asks the breaker whether the next attempt may go out. On refusal
// it returns the call's final error.
func (c *call) admit() (breaker.Permit, error) {
	if err := c.admitAdaptive(); err != nil {
		return breaker.Permit{}, err
	}
	if c.brk == nil {
		return breaker.Permit{}, nil
	}
	p, err := c.brk.Allow()
	if err != nil {
		return p, c.stop(StopBreakerOpen)
	}
	return p, nil
}

// attemptContext returns the context of the next attempt: the caller's,
// with the attempt metadata and, if timeout is set, the per-attempt
// timeout. Call it once the breaker admitted the attempt: the first one
// records the request in the budget.
func (c *call) attemptContext(timeout bool) (context.Context, context.CancelFunc) {
	ctx := c.ctx
	if c.attempt == 0 && c.lim != nil {
		c.lim.RecordRequest()
	}
	var kv [6]string
	n := 0
	if c.attempt > 0 {
		kv[0], kv[1] = MetadataAttempt, strconv.Itoa(c.attempt)
		n = 2
	}
	if c.st != nil {
		kv[n], kv[n+1] = MetadataDepth, strconv.Itoa(min(c.info.Depth+1, MaxDepth))
		n += 2
		if c.info.UpstreamRetries > 0 {
			kv[n], kv[n+1] = MetadataUpstreamRetries, strconv.Itoa(c.info.UpstreamRetries)
			n += 2
		}
	}
	if n > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, kv[:n]...)
	}
	if c.cfg.observer != nil {
		c.started = time.Now()
		c.observe(Event{Kind: EventAttemptStart, Attempt: c.attempt})
	}
	c.attempt++
	if d := c.cfg.perAttemptTimeout; d > 0 && timeout {
		return context.WithTimeout(ctx, d)
	}
	return ctx, func() {}
}

// after judges the attempt that just ended with err and trailer. It
// returns the wait before the next attempt, or a negative wait and the
// call's final error (nil on success).
func (c *call) after(permit breaker.Permit, err error, trailer metadata.MD) (time.Duration, error) {
	pb, hasPB := c.settle(permit, err, trailer)
	return c.next(err, pb, hasPB)
}

// settle reports the outcome of an attempt to the breaker (through its
// permit) and to the limiter, and returns the attempt's pushback. Failures
// are UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED of the attempt's
// own timeout, a retryable code answered with "do not retry", and an
// attempt still unanswered when the caller's deadline expired; anything
// else, a "do not retry" trailer on a success or on a code that is not
// retried included, shows a live target: success.
//
// The caller's context: a target that hangs until the caller's deadline
// is the most expensive failure there is, and counts as one (a unary
// call, or a stream before its first header or message; a stream that
// answered and then ran into the deadline counts for nothing, since long
// streams often end that way). A caller that cancels on its own says
// nothing about the target: the attempt counts for nothing.
//
// One exception: a half-open probe answered "do not retry" is Ignored. The
// answer came from a live target whose own dependency failed (often a
// breaker of the tier below, still open); counting it would reopen this
// breaker with a doubled interval each time, so that after an outage the
// breakers of a chain, each waiting for the one below, recover one after
// the other. Ignored, the probe frees its slot and the breaker stays
// half-open, sending a few probes until the tier below is back. In the
// closed state the same answer counts as a failure, so the tier above
// stops sending while the chain below it is broken.
func (c *call) settle(permit breaker.Permit, err error, trailer metadata.MD) (pb int64, hasPB bool) {
	code := status.Code(err)
	pb, hasPB = pushback(trailer)
	if c.cfg.observer != nil {
		c.observe(Event{Kind: EventAttemptEnd, Attempt: c.attempt - 1, Code: code, Duration: time.Since(c.started)})
	}
	dontRetry := err != nil && hasPB && pb < 0
	failure := code == codes.Unavailable || code == codes.ResourceExhausted ||
		(code == codes.DeadlineExceeded && c.timedOut) || (dontRetry && c.retryable(code))
	// A refusal by the target's admission control (busy) is its own
	// class: the target is alive, so the breaker ignores it and the
	// adaptive throttle slows down for it but never calls the target
	// down; the budget counts it as a failure.
	busy := err != nil && shedMarked(trailer)
	failure = failure || c.deadlineAnswer(code)
	ignored := false
	if err != nil && c.ctx.Err() != nil {
		// The caller's context ended: a hang until its deadline is the
		// target's failure; a caller that cancelled says nothing.
		if c.hung() {
			failure = true
		} else {
			ignored = true
		}
	}
	c.settleAdaptive(err, failure, busy, dontRetry && !busy, ignored)
	if ignored {
		permit.Done(breaker.Ignored)
		return pb, hasPB
	}
	switch {
	case busy || dontRetry && permit.Probe():
		permit.Done(breaker.Ignored)
	case failure:
		permit.Done(breaker.Failure)
	default:
		permit.Done(breaker.Success)
	}
	if c.lim != nil {
		c.lim.RecordOutcome(!failure)
	}
	return pb, hasPB
}

// hung reports whether the caller's deadline expired before the target
// answered: a failure of the target, unlike a caller that cancelled.
func (c *call) hung() bool {
	return !c.answered.Load() && errors.Is(c.ctx.Err(), context.DeadlineExceeded)
}

// next decides what follows an attempt that ended with err (nil: the call
// succeeded) and pushback pb: the wait before the next attempt, or a
// negative wait and the call's final error.
func (c *call) next(err error, pb int64, hasPB bool) (time.Duration, error) {
	if err == nil {
		return -1, nil
	}
	c.last = err
	switch {
	case c.ctx.Err() != nil:
		return -1, c.stop(StopCanceled)
	case !c.retryable(status.Code(err)):
		return -1, c.stop(StopNotRetryable)
	case c.committed:
		return -1, c.stop(StopCommitted)
	case hasPB && pb < 0:
		return -1, c.stop(StopPushback)
	case c.attempt >= c.max:
		if c.max < c.cfg.maxAttempts {
			return -1, c.stop(StopTierPolicy)
		}
		return -1, c.stop(StopAttempts)
	}
	var wait time.Duration
	if hasPB {
		// The server's wait, bounded by the cap; compared in milliseconds
		// first, since a huge pb would overflow time.Duration.
		wait = c.cfg.backoff.withDefaults().Cap
		if pb < wait.Milliseconds() {
			wait = time.Duration(pb) * time.Millisecond
		}
	} else if c.attempt == 1 && c.thr != nil && c.thr.Healthy() {
		// A lone failure of a healthy target is random: retry at once
		// (see adaptive.Throttle.Healthy). The budget bounds these
		// retries as any other.
		wait = 0
	} else {
		wait = c.cfg.backoff.Delay(c.attempt-1, c.cfg.rand(), c.prev)
	}
	if dl, ok := c.ctx.Deadline(); ok && time.Until(dl) <= wait {
		return -1, c.stop(StopDeadline)
	}
	// An open breaker would refuse the retry after the wait: stop now,
	// without spending the budget on it. (A breaker whose open interval
	// has passed still reads Open until a call's Allow moves it on; that
	// call, not this retry, becomes the probe.)
	if c.brk != nil && c.brk.State() == breaker.Open {
		return -1, c.stop(StopBreakerOpen)
	}
	if c.adaptiveRefusesRetry() {
		return -1, c.stop(StopThrottled)
	}
	// The budget is asked before the wait, so that a refusal reaches the
	// user at once. A retry that then never goes out (the caller cancels,
	// the breaker opens meanwhile) stays counted: the budget errs towards
	// fewer retries.
	if c.lim != nil && !c.lim.TryRetry() {
		return -1, c.stop(StopBudget)
	}
	c.prev = wait
	c.observe(Event{Kind: EventRetryScheduled, Attempt: c.attempt, Delay: wait})
	return wait, nil
}

// stop ends the call for reason: it marks the request this call serves
// (so that its server answers "do not retry") and returns the call's
// error. A call that made one attempt and stopped on its own terms returns
// that attempt's error untouched.
func (c *call) stop(reason StopReason) error {
	c.giveUp(reason)
	if c.attempt <= 1 && c.last != nil && (reason == StopNotRetryable || reason == StopCanceled) {
		return c.last
	}
	return newError(c.last, c.attempt, reason, c.target)
}

// canceled ends the call when the caller's context ended during the wait
// before a retry. Like grpc-go's own retry, the call then ends with the
// context's code (Canceled or DeadlineExceeded), and the error unwraps to
// the context's error as well as to the last attempt's.
func (c *call) canceled() error {
	cerr := c.ctx.Err()
	if cerr == nil { // a wait that failed for another reason
		return c.stop(StopCanceled)
	}
	c.giveUp(StopCanceled)
	e := newError(c.last, c.attempt, StopCanceled, c.target)
	e.st = status.FromContextError(cerr)
	e.cause = cerr
	return e
}

// giveUp marks the request this call serves, so that its server answers
// "do not retry", when the call stops retrying a retryable failure for
// reason, and reports the refusal.
func (c *call) giveUp(reason StopReason) {
	if !reason.marksUpstream() {
		return
	}
	if c.st != nil {
		c.st.gaveUp.Store(true)
	}
	code := codes.Unavailable // what an open breaker answers before any attempt
	if c.last != nil {
		code = status.Code(c.last)
	}
	c.observe(Event{Kind: EventRetryRefused, Attempt: c.attempt, Reason: reason, Code: code})
}

// sleepCtx waits for d or until ctx is done, whichever comes first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DialOptions is New(opts...).DialOptions(), with invalid options failing
// every call instead of returning an error.
func DialOptions(opts ...Option) []grpc.DialOption {
	i, err := New(opts...)
	if err != nil {
		return []grpc.DialOption{
			grpc.WithDisableRetry(),
			grpc.WithChainUnaryInterceptor(UnaryClientInterceptor(opts...)),
			grpc.WithChainStreamInterceptor(StreamClientInterceptor(opts...)),
		}
	}
	return i.DialOptions()
}
