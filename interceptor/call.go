package interceptor

import (
	"context"
	"errors"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// call is the retry state of one client call, shared by the unary and
// stream retry loops: the mechanisms of its target, which attempt this
// is, what the tier policy allows, and the last error.
type call struct {
	ctx    context.Context // the caller's
	cfg    *config
	st     *serverState // the request this call serves, if any
	info   Info
	method string
	key    string    // of the per-target mechanisms
	conn   connState // the call's channel, for the throttle

	mechs [maxMechanisms]mechanism

	max     int // attempts allowed for this call, after the tier policy
	attempt int // attempts made so far
	prev    time.Duration
	last    error
	// retryNow: a mechanism judged the last failure a lone, random one
	// (see adaptive.Throttle.Healthy): its retry goes without a wait.
	retryNow bool
	// committed: the call can no longer be retried (gRFC A6): response
	// headers or a message arrived, or a stream outgrew its replay buffer.
	committed bool
	// hedging: the call hedges (see WithHedging); its attempts carry
	// MetadataHedging. hedgeNext: the next attempt is a hedge.
	hedging, hedgeNext bool
	// running: a unary call's current attempt went out and is not yet
	// reported (see unaryCall.panicked). Here, with the flags, rather than
	// in unaryCall: so the unary call fits its allocation's size class.
	running bool
	nmechs  uint8 // mechs in use
}

// init prepares c for a call to method of target (normalized: one key
// for every spelling of an address), with the mechanisms of its key.
//
// c is a zero call (a new one); its fields are set one by one.
func (c *call) init(ctx context.Context, cfg *config, target, method string) {
	c.ctx, c.cfg, c.method, c.st = ctx, cfg, method, stateFrom(ctx)
	if c.st != nil {
		c.info = c.st.Info()
	}
	c.max = max(1, min(cfg.policy(c.info, cfg.maxAttempts), cfg.maxAttempts))
	c.key = target
	if cfg.perMethod {
		c.key = cfg.methodKeys.key(target, method)
	}
	for _, f := range cfg.mechanisms {
		if m := f(c.key); m != nil && int(c.nmechs) < len(c.mechs) {
			c.mechs[c.nmechs] = m
			c.nmechs++
		}
	}
}

func (c *call) mechanisms() []mechanism { return c.mechs[:c.nmechs] }

// begin asks every mechanism whether attempt a, the call's next, may go
// out. On a refusal, or a panic in a mechanism (an observer's), the
// mechanisms that allowed it hear that it counts for nothing, and begin
// returns the call's final error (or lets the panic go on).
func (c *call) begin(a *attempt) error {
	if r := c.admit(a); r != 0 {
		return c.stop(r)
	}
	return nil
}

// admit is begin without ending the call: it returns why a mechanism
// refused the attempt, or zero.
func (c *call) admit(a *attempt) StopReason {
	a.n = int32(c.attempt)
	ms := c.mechanisms()
	allowed, returned := 0, false
	defer func() {
		if !returned {
			c.reportTo(ms[:allowed], a, panicked)
		}
	}()
	for _, m := range ms {
		if r := m.allow(c, a); r != 0 {
			returned = true
			c.reportTo(ms[:allowed], a, outcome{})
			return r
		}
		allowed++
	}
	returned = true
	return 0
}

// panicked is the outcome of an attempt cut short by a panic (in the
// invoker, the streamer, a codec, an observer): nothing, with the code a
// recovery interceptor usually gives it, for the observer's event.
var panicked = outcome{kind: outcomeNothing, code: codes.Unknown}

// cancelledByUs is the outcome of an attempt the call itself cancelled (a
// stream's retry dropped because the stream committed while it opened; a
// hedge that lost): nothing.
var cancelledByUs = outcome{kind: outcomeNothing, code: codes.Canceled}

// report tells every mechanism how attempt a ended, the last asked first.
func (c *call) report(a *attempt, o outcome) { c.reportTo(c.mechanisms(), a, o) }

func (c *call) reportTo(ms []mechanism, a *attempt, o outcome) {
	i := len(ms) - 1
	defer func() {
		if i >= 0 {
			// ms[i].done panicked (an observer's, a limiter of the
			// user's): the others still hear, so that none keeps a slot
			// for the attempt (a half-open breaker's probe), and then the
			// panic goes on.
			c.reportTo(ms[:i], a, o)
		}
	}()
	for ; i >= 0; i-- {
		ms[i].done(c, a, o)
	}
}

// abandoned tells the mechanisms that hold a scarce slot for attempt a
// (see abandoner) that its caller left it with outcome o.
func (c *call) abandoned(a *attempt, o outcome) {
	for _, m := range c.mechanisms() {
		if ab, ok := m.(abandoner); ok {
			ab.abandoned(c, a, o)
		}
	}
}

// answered tells the mechanisms that the target answered attempt a (a
// stream's header or message): see answerer.
func (c *call) answered(a *attempt) {
	a.answered.Store(true)
	for _, m := range c.mechanisms() {
		if an, ok := m.(answerer); ok {
			an.answered(c, a)
		}
	}
}

// attemptContext returns the context of the call's next attempt: the
// caller's, with the attempt metadata and, if timeout is set, the
// per-attempt timeout. Call it once begin admitted the attempt. A first
// attempt whose metadata is shared (see withShared) gets a context made
// in into, when into is not nil: the call's own, which outlives the
// attempt.
func (c *call) attemptContext(timeout bool, into *mdContext) (context.Context, context.CancelFunc) {
	ctx, shared := c.sharedContext(into)
	if !shared {
		ctx = c.withMetadata()
	}
	c.attempt++
	if d := c.cfg.perAttemptTimeout; d > 0 && timeout {
		return context.WithTimeout(ctx, d)
	}
	return ctx, func() {}
}

// sharedContext returns the context of the call's next attempt made in
// into, if it is a first attempt whose metadata is shared.
func (c *call) sharedContext(into *mdContext) (context.Context, bool) {
	if into == nil || c.attempt > 0 || c.info.UpstreamRetries > 0 || c.servesTrial() || c.info.Held {
		return nil, false
	}
	return withShared(into, c.ctx, c.sendDepth(), c.hedgingMark()) // none for no metadata
}

// withMetadata returns the caller's context with the metadata of the
// call's next attempt.
func (c *call) withMetadata() context.Context {
	var buf [12]string // six pairs at most
	kv := attemptPairs(buf[:0], c.attempt, c.sendDepth(), c.info.UpstreamRetries, c.hedgingMark(), c.servesTrial(), c.info.Held)
	if len(kv) == 0 {
		return c.ctx
	}
	return metadata.AppendToOutgoingContext(c.ctx, kv...)
}

// sendDepth is the x-call-depth of the call's attempts, 0 for none: an
// edge client (serving no request) sends none.
func (c *call) sendDepth() int {
	if c.st == nil {
		return 0
	}
	return min(c.info.Depth+1, MaxDepth)
}

// attemptPairs appends to kv the metadata pairs of an attempt (protocol
// sections 2.2, 2.5, 2.6 and 2.7): its index n, the depth, the upstream
// retries u and the hedging mark, each only when above 0, and the trial
// and held marks.
func attemptPairs(kv []string, n, depth, u, mark int, trial, held bool) []string {
	if n > 0 {
		kv = append(kv, MetadataAttempt, strconv.Itoa(n))
	}
	if depth > 0 {
		kv = append(kv, MetadataDepth, strconv.Itoa(depth))
	}
	if u > 0 {
		kv = append(kv, MetadataUpstreamRetries, strconv.Itoa(u))
	}
	if mark > 0 {
		kv = append(kv, MetadataHedging, strconv.Itoa(mark))
	}
	if trial {
		kv = append(kv, MetadataTrial, "1")
	}
	if held {
		kv = append(kv, MetadataHeld, "1")
	}
	return kv
}

// servesTrial reports whether the call serves a trial: a request that
// this tier's admission control let in as one, or that carried
// MetadataTrial (protocol section 2.6).
func (c *call) servesTrial() bool { return c.info.Trial }

// hedgingMark is the MetadataHedging value of the call's next attempt,
// or 0 for none: hedgeMark for a hedge or an attempt that serves one,
// hedgingMark for the other attempts of a call that hedges or serves a
// request that a tier above hedges (protocol section 2.5).
func (c *call) hedgingMark() int {
	switch {
	case c.hedgeNext || c.info.Hedge:
		return hedgeMark
	case c.hedging || c.info.Hedged:
		return hedgingMark
	}
	return 0
}

// classify reads how attempt a ended, with err (nil: a success) and the
// answer's trailer (see classify in outcome.go).
func (c *call) classify(a *attempt, err error, trailer metadata.MD) outcome {
	if err == nil {
		return outcome{kind: outcomeSuccess}
	}
	code := status.Code(err)
	pb, hasPB := pushback(trailer)
	cerr := c.ctx.Err()
	e := ending{
		code: code, shed: shedMarked(trailer), pushback: pb, hasPushback: hasPB,
		callerDone: cerr != nil, callerExpired: errors.Is(cerr, context.DeadlineExceeded),
		answered: a.answered.Load(), ownTimeout: a.timedOut, stream: a.stream,
	}
	if code == codes.DeadlineExceeded {
		e.retried = a.timedOut // never the caller's deadline
		e.pastDeadline = !a.timedOut && cerr == nil && c.pastDeadline()
	} else {
		e.retried = c.cfg.retries(code)
	}
	if code == codes.OK { // an error without a status code: not a success
		e.code = codes.Unknown
	}
	return classify(e)
}

// pastDeadline reports whether the caller's deadline has passed while its
// context is not yet done. The caller's deadline travels with the call,
// and the server's timer can fire before the caller's: grpc-go then ends
// the call with the server's RST_STREAM, reported as DEADLINE_EXCEEDED,
// while the caller's context is not yet done. Judged as an answer, such
// an attempt counted as an accept, and a probe that met a hanging target
// revived it (TestAdaptiveHangOverGRPC). A DEADLINE_EXCEEDED that comes
// before the caller's deadline (a tier below whose own timeout expired)
// stays an answer.
func (c *call) pastDeadline() bool {
	dl, ok := c.ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// ownTimeout reports whether an attempt made in actx that ended with err
// at now ran into its own per-attempt timeout, which alone makes
// DeadlineExceeded retryable. That is a DeadlineExceeded, while the
// caller's context is alive, of an attempt whose deadline was its own
// (earlier than the caller's) and had passed when the attempt ended.
//
// Whose timer fired first does not matter. The server's deadline is the
// attempt's, sent in grpc-timeout: gRPC computes it from the time left
// when the request goes out, rounded up, and the server starts it when
// the request arrives, so it never expires before the attempt's own.
// When the server's timer runs before the client's, its DeadlineExceeded
// arrives while actx.Err() is still nil, but never before actx's
// deadline: comparing the deadline with the time is exact where
// actx.Err() races. A DeadlineExceeded that arrives before the attempt's
// deadline is the server's own (a dependency of its timed out) and is not
// retried; one under the caller's deadline (the attempt's deadline is the
// caller's) is never retried either.
func (c *call) ownTimeout(actx context.Context, err error, now time.Time) bool {
	if c.cfg.perAttemptTimeout <= 0 || status.Code(err) != codes.DeadlineExceeded || c.ctx.Err() != nil {
		return false
	}
	adl, ok := actx.Deadline()
	if !ok || now.Before(adl) {
		return false
	}
	cdl, ok := c.ctx.Deadline()
	return !ok || adl.Before(cdl)
}

// next decides what follows an attempt that ended with err (nil: the call
// succeeded) and outcome o: the wait before the next attempt, or a
// negative wait and the call's final error.
func (c *call) next(err error, o outcome) (time.Duration, error) {
	if err == nil {
		return -1, nil
	}
	c.last = err
	if r := c.mayRetry(o); r != 0 {
		return -1, c.stop(r)
	}
	wait := c.wait(o)
	if dl, ok := c.ctx.Deadline(); ok && !roomForRetry(time.Until(dl), wait) {
		return -1, c.stop(StopDeadline)
	}
	for _, m := range c.mechanisms() {
		if r := m.retry(c); r != 0 {
			return -1, c.stop(r)
		}
	}
	c.prev = wait
	c.observe(Event{Kind: EventRetryScheduled, Attempt: c.attempt, Delay: wait})
	return wait, nil
}

// roomForRetry reports whether a retry that waits wait can start before
// the caller's deadline, remaining away: only if remaining > wait
// (protocol section 2.4, "Backoff and the deadline"). A retry that would start at the
// deadline could not be answered.
func roomForRetry(remaining, wait time.Duration) bool { return remaining > wait }

// mayRetry reports why the call cannot retry after outcome o, before any
// mechanism is asked, or zero.
func (c *call) mayRetry(o outcome) StopReason {
	switch {
	case c.ctx.Err() != nil:
		return StopCanceled
	case !o.mayRetry():
		return StopNotRetryable
	case c.committed:
		return StopCommitted
	case o.saysDontRetry():
		return StopPushback
	case c.attempt >= c.max && c.max < c.cfg.maxAttempts:
		return StopTierPolicy
	case c.attempt >= c.max:
		return StopAttempts
	}
	return 0
}

// wait returns the wait before the retry after outcome o: the server's
// pushback, bounded by the backoff's cap (compared in milliseconds first,
// since a huge pushback would overflow time.Duration); none after a lone
// failure of a healthy target (the budget bounds these retries as any
// other); the backoff otherwise.
func (c *call) wait(o outcome) time.Duration {
	switch {
	case o.hasPushback:
		wait := c.cfg.backoff.withDefaults().Cap
		if o.pushback <= wait.Milliseconds() { // no overflow below
			wait = min(wait, time.Duration(o.pushback)*time.Millisecond)
		}
		return wait
	case c.retryNow:
		return 0
	}
	return c.cfg.backoff.Delay(c.attempt-1, c.cfg.rand(), c.prev)
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
	return newError(c.last, c.attempt, reason)
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
	e := newError(c.last, c.attempt, StopCanceled)
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
