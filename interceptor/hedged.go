package interceptor

import (
	"context"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// This file is the retry loop of a hedged unary call (WithHedging).
//
// The lead attempt (the first, and a retry once every attempt failed)
// runs on the caller's goroutine, as an attempt of a call that does not
// hedge, with a timer for the hedge delay (none while the rules say no
// hedge: see rules). An answer before the delay stops the timer, and the
// call goes on as any other: a call that sends no hedge costs a
// cancellable context more (the timer comes from a pool, see
// leadTimer). When the timer fires first, its goroutine becomes the
// call's coordinator until the call has its answer: it sends the hedges (each on a goroutine of its
// own), hears every attempt end (the lead's too, handed over by the
// caller's goroutine, which then waits for the coordinator's verdict),
// and alone asks and tells the mechanisms, so that they never hear of
// one call from two goroutines at once.

// hedgedUnary is a unary call that may hedge: the retry state and the
// hedging state in one allocation.
type hedgedUnary struct {
	unaryCall
	h hedgeCall
}

// hedgeTry is one attempt of a hedged call, with its own context,
// header and trailer (and, for a hedge, reply and peer), so that
// attempts in flight at once share nothing.
type hedgeTry struct {
	a        attempt
	ctx      context.Context
	stop     context.CancelFunc // of ctx
	timeout  context.CancelFunc // of the per-attempt timeout
	reply    any                // the caller's for the lead, else a fresh one
	header   metadata.MD
	trailer  metadata.MD
	peer     peer.Peer
	hopt     grpc.HeaderCallOption
	topt     grpc.TrailerCallOption
	popt     grpc.PeerCallOption
	start    time.Time
	took     time.Duration // from start to judge
	err      error
	panicVal any  // what a hedge's invoker panicked with
	panicked bool // the invoker panicked
	ours     bool // we cancelled it: another attempt answered
	isHedge  bool // sent as a hedge, while another attempt was in flight
}

func (t *hedgeTry) cancel() {
	if t.stop != nil { // nil: a lead that panicked before it went out
		t.stop()
		t.timeout()
	}
}

// hedgeCall is the state of a hedged call.
type hedgeCall struct {
	c        *call
	method   string
	req      any
	reply    any // the caller's
	replyT   protoreflect.MessageType
	cc       *grpc.ClientConn
	invoker  grpc.UnaryInvoker
	userOpts []grpc.CallOption // the caller's
	target   *hedgeTarget      // the delay, the hedges won

	lead     hedgeTry
	leadOpts []grpc.CallOption
	optsBuf  [4]grpc.CallOption
	timer    stopper
	out      *mdContext // the unary call's, for the first lead's context (see withShared)
	// mu orders the lead's end and the first hedge delay's: whichever
	// comes first decides whether a coordinator runs (coordinating) or
	// not (leadDone). gen numbers the leads, so that the timer of an
	// earlier one, stopped too late, takes no part.
	mu           sync.Mutex
	gen          uint64
	leadDone     bool
	coordinating bool

	// The call's, across its leads.
	hedges    int  // hedges sent
	noHedges  bool // no more hedges: refused, or "do not retry"
	dontRetry bool // an attempt answered "do not retry"

	// The coordinator's, made when the first hedge delay passed.
	hedgeOpts []grpc.CallOption // the caller's, without user's
	user      userOptions
	results   chan *hedgeTry
	verdict   chan hedgeVerdict
	flight    []*hedgeTry
	tick      chan struct{}
	tickStop  stopper
	// waited is the wait before the hedge due: the hedge delay, or a
	// pushback (for EventHedgeSent, and EventHedgeRefused for ruled).
	waited time.Duration
	// ruled: why the rules gave the lead no timer (see startLead), 0 if
	// they did not; reported if the lead outlasted its delay, waited.
	ruled StopReason
}

// hedgeVerdict is what the coordinator hands the caller's goroutine: the
// wait before the next lead (negative: none), or the call's error; or a
// panic of the coordinator, to be raised again there.
type hedgeVerdict struct {
	wait     time.Duration
	err      error
	panicVal any
	panicked bool
}

// userOptions are the caller's options that receive what an attempt
// answered: they get the winning attempt's, not every attempt's.
type userOptions struct {
	header  []*metadata.MD
	trailer []*metadata.MD
	peer    []*peer.Peer
}

// splitOptions returns opts without the header, trailer and peer
// options, which it returns apart.
func splitOptions(opts []grpc.CallOption) ([]grpc.CallOption, userOptions) {
	var u userOptions
	rest := make([]grpc.CallOption, 0, len(opts)+3)
	for _, o := range opts {
		switch o := optionValue(o).(type) {
		case grpc.HeaderCallOption:
			u.header = append(u.header, o.HeaderAddr)
		case grpc.TrailerCallOption:
			u.trailer = append(u.trailer, o.TrailerAddr)
		case grpc.PeerCallOption:
			u.peer = append(u.peer, o.PeerAddr)
		default:
			rest = append(rest, o)
		}
	}
	return rest, u
}

// optionValue returns the header, trailer or peer option that o points
// to, or o: grpc-go reads either (an interceptor further out may pass
// its own as pointers, as this package does).
func optionValue(o grpc.CallOption) grpc.CallOption {
	switch p := o.(type) {
	case *grpc.HeaderCallOption:
		if p != nil {
			return *p
		}
	case *grpc.TrailerCallOption:
		if p != nil {
			return *p
		}
	case *grpc.PeerCallOption:
		if p != nil {
			return *p
		}
	}
	return o
}

// run runs the call with hedges: the lead attempts, with the wait
// between them.
func (hu *hedgedUnary) run(ht *hedgeTarget, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	c, h := &hu.call, &hu.h
	*h = hedgeCall{c: c, out: &hu.out, target: ht, method: method, req: req, reply: reply, replyT: replyType(reply), cc: cc, invoker: invoker, userOpts: opts}
	c.hedging = true
	for {
		wait, err := h.leadAttempt()
		if err != nil || wait < 0 {
			return err
		}
		if err := c.cfg.sleep(c.ctx, wait); err != nil {
			return c.canceled()
		}
	}
}

// leadAttempt makes a lead attempt (see unaryCall.begin and end, which
// it follows) with the timer for the first hedge, and returns the wait
// before the next lead or the call's error: its own verdict if it
// answered first, else the coordinator's.
func (h *hedgeCall) leadAttempt() (time.Duration, error) {
	c, t := h.c, &h.lead
	*t = hedgeTry{}
	if err := c.begin(&t.a); err != nil {
		return -1, err
	}
	returned := false
	defer func() {
		if !returned { // only on a panic, which goes on after this
			h.leadPanicked()
		}
	}()
	h.startLead()
	t.err = h.invoker(t.ctx, h.method, h.req, h.reply, h.cc, h.leadOpts...)
	returned = true
	if h.endLead() {
		o := h.judge(t)
		if h.ruled != 0 && t.took >= h.waited {
			// The hedge the lead's wait made due, which the rules
			// refused as it started (no timer, no coordinator).
			c.observe(Event{Kind: EventHedgeRefused, Attempt: c.attempt, Reason: h.ruled})
		}
		c.committed = t.header != nil
		return c.next(t.err, o)
	}
	h.results <- t
	v := <-h.verdict
	if v.panicked {
		panic(v.panicVal)
	}
	return v.wait, v.err
}

// startLead prepares the lead attempt's context and options, and starts
// the timer for the first hedge if the call may still send one.
func (h *hedgeCall) startLead() {
	c, t := h.c, &h.lead
	h.mu.Lock() // first: a panic below must find no coordinator of an earlier lead
	h.gen++
	gen := h.gen
	h.leadDone, h.coordinating = false, false
	h.mu.Unlock()
	h.timer = nil
	actx, timeout := c.attemptContext(true, h.out)
	t.start = c.cfg.now()
	delay := c.hedgeDelay(h.target)
	// A lead that cannot be hedged (the rules say no now) needs neither a
	// timer nor a context of its own to cancel: no coordinator will run.
	hedgeable := h.hedgeDue()
	h.ruled, h.waited = 0, delay
	if hedgeable {
		if h.ruled = h.rules(t.start, true); h.ruled != 0 {
			hedgeable = false
		}
	}
	t.ctx, t.stop = actx, noCancel
	if hedgeable {
		t.ctx, t.stop = context.WithCancel(actx)
	}
	t.timeout, t.reply = timeout, h.reply
	t.hopt.HeaderAddr, t.topt.TrailerAddr = &t.header, &t.trailer
	h.leadOpts = append(append(h.optsBuf[:0], h.userOpts...), &t.hopt, &t.topt)
	if hedgeable {
		h.timer = h.startTimer(delay, gen)
	}
}

func noCancel() {}

// rules reports why the target may get no hedge by the rules of its own
// (it is queueing, its hedges lose, they are at their share of the
// calls), or zero; lead: asked as a lead attempt starts. While it may
// not, a lead starts no timer, and a call costs only the mark more than
// one that does not hedge; mayHedge asks again when a hedge is due.
func (h *hedgeCall) rules(now time.Time, lead bool) StopReason {
	r := h.target.allows(now, lead)
	if h.target.delay.Queueing() {
		return StopQueueing
	}
	return r
}

// endLead reports whether the lead ended before its hedge delay, and
// if so stops the timer: no coordinator runs. Otherwise one does, and
// hears of the lead's end from the caller's goroutine.
func (h *hedgeCall) endLead() bool {
	h.mu.Lock()
	alone := !h.coordinating
	h.leadDone = true
	h.mu.Unlock()
	if alone && h.timer != nil {
		h.timer.Stop()
		h.timer = nil // a leadTimer may be another call's after Stop
	}
	return alone
}

// startTimer starts the wait of lead gen for its first hedge: on the
// real clock from a pool (see leadTimer), else with the test's clock.
func (h *hedgeCall) startTimer(d time.Duration, gen uint64) stopper {
	if f := h.c.cfg.afterFunc; f != nil {
		return f(d, func() { h.coordinate(gen) })
	}
	return startLeadTimer(d, h, gen)
}

// hedgeDue reports whether the call may send a hedge later.
func (h *hedgeCall) hedgeDue() bool {
	return !h.noHedges && h.hedges < h.c.cfg.hedging.maxHedges && h.c.attempt < h.c.max
}

// leadPanicked reports a lead attempt whose invoker panicked: to the
// mechanisms, or, when a coordinator runs, to it, waiting until it has
// cancelled the other attempts.
func (h *hedgeCall) leadPanicked() {
	t := &h.lead
	t.panicked = true
	if h.endLead() {
		t.cancel()
		h.c.report(&t.a, panicked)
		return
	}
	h.results <- t
	<-h.verdict
}

// coordinate is the timer's function for lead gen: if that lead is
// still running, it runs the call until its verdict, which it hands to
// the caller's goroutine.
func (h *hedgeCall) coordinate(gen uint64) {
	h.mu.Lock()
	if h.leadDone || h.gen != gen {
		h.mu.Unlock()
		return // the lead answered first
	}
	h.coordinating = true
	h.results = make(chan *hedgeTry, h.c.max)
	h.verdict = make(chan hedgeVerdict, 1)
	h.mu.Unlock()
	var v hedgeVerdict
	finished := false
	defer func() {
		if !finished {
			// A panic here (an observer's, a mechanism's): the attempts are
			// cancelled, and the panic raised on the caller's goroutine.
			v = hedgeVerdict{panicVal: recover(), panicked: true}
			h.abort()
		}
		h.verdict <- v
	}()
	v.wait, v.err = h.hedge()
	finished = true
}

// hedge sends the first hedge and waits for the verdict.
func (h *hedgeCall) hedge() (time.Duration, error) {
	if h.hedgeOpts == nil {
		h.hedgeOpts, h.user = splitOptions(h.userOpts)
	}
	h.flight = append(h.flight[:0], &h.lead)
	defer h.stopTick()
	h.fire()
	for {
		select {
		case t := <-h.results:
			if done, wait, err := h.ended(t); done {
				return wait, err
			}
		case <-h.tick:
			h.fire()
		}
	}
}

// fire sends a hedge if every mechanism allows one, and starts the wait
// for the next.
func (h *hedgeCall) fire() {
	c := h.c
	if !h.hedgeDue() {
		return
	}
	r := h.mayHedge()
	if r == 0 {
		if r = h.launch(); r == 0 {
			h.hedges++
			h.target.count(c.cfg.now(), false)
			c.observe(Event{Kind: EventHedgeSent, Attempt: c.attempt - 1, Delay: h.waited})
			if h.hedgeDue() {
				h.startTick(c.hedgeDelay(h.target))
			}
			return
		}
	}
	// The attempts in flight still answer the call.
	h.noHedges = true
	c.observe(Event{Kind: EventHedgeRefused, Attempt: c.attempt, Reason: r})
}

// mayHedge reports why the call may not send a hedge now, or zero.
func (h *hedgeCall) mayHedge() StopReason {
	c := h.c
	if dl, ok := c.ctx.Deadline(); ok && !roomForRetry(time.Until(dl), 0) {
		return StopDeadline
	}
	if c.ctx.Err() != nil {
		return StopCanceled
	}
	if r := h.rules(c.cfg.now(), false); r != 0 {
		return r
	}
	for _, m := range c.mechanisms() {
		if r := m.retry(c); r != 0 {
			return r
		}
	}
	return 0
}

// launch sends a hedge, if the mechanisms allow it: zero, or why one
// refused it.
func (h *hedgeCall) launch() StopReason {
	c := h.c
	t := &hedgeTry{isHedge: true}
	if r := c.admit(&t.a); r != 0 {
		return r
	}
	c.hedgeNext = true
	actx, timeout := c.attemptContext(true, nil)
	c.hedgeNext = false
	t.ctx, t.stop = context.WithCancel(actx)
	t.timeout, t.reply = timeout, h.replyT.New().Interface()
	t.hopt.HeaderAddr, t.topt.TrailerAddr, t.popt.PeerAddr = &t.header, &t.trailer, &t.peer
	opts := append(h.hedgeOpts[:len(h.hedgeOpts):len(h.hedgeOpts)], t.hopt, t.topt, t.popt)
	t.start = c.cfg.now()
	h.flight = append(h.flight, t)
	go h.runHedge(t, opts)
	return 0
}

// runHedge is a hedge's goroutine: it makes the attempt and hands it
// back, a panic of the invoker too, to be raised again on the caller's
// goroutine, where a recovery interceptor further out sees it.
func (h *hedgeCall) runHedge(t *hedgeTry, opts []grpc.CallOption) {
	t.panicked = true // until the invoker returns
	defer func() {
		if t.panicked {
			t.panicVal = recover()
		}
		h.results <- t
	}()
	t.err = h.invoker(t.ctx, h.method, h.req, t.reply, h.cc, opts...)
	t.panicked = false
}

// ended handles the end of attempt t: whether the call is over, and the
// wait before the next lead or the call's error.
func (h *hedgeCall) ended(t *hedgeTry) (bool, time.Duration, error) {
	c := h.c
	o := h.judge(t)
	if t.panicked {
		h.cancelAll()
		h.raise(t)
	}
	committed := t.header != nil
	if t.err == nil || committed || !o.mayRetry() {
		// The call's answer (gRFC A6): a success, a commit, a code that is
		// not retried. The other attempts are cancelled.
		c.committed = committed
		h.cancelAll()
		return true, -1, h.answer(t, o)
	}
	c.last = t.err
	if o.saysDontRetry() {
		h.dontRetry, h.noHedges = true, true
	}
	if len(h.flight) > 0 {
		switch {
		case !h.hedgeDue():
		case o.hasPushback && o.pushback >= 0:
			h.startTick(c.wait(o)) // gRFC A6: the next hedge waits the pushback
		case !o.hasPushback:
			h.stopTick()
			h.fire() // gRFC A6: after a failure, the next hedge goes at once
		}
		return false, 0, nil // an attempt in flight may still answer
	}
	h.deliver(t)
	if h.dontRetry && !o.saysDontRetry() {
		return true, -1, c.stop(StopPushback)
	}
	wait, err := c.next(t.err, o)
	return true, wait, err
}

// raise raises again the panic of attempt t: the lead's goes on by
// itself on the caller's goroutine.
func (h *hedgeCall) raise(t *hedgeTry) {
	if t != &h.lead {
		panic(t.panicVal)
	}
	panic(leadPanic{})
}

// leadPanic is what the coordinator panics with when the lead panicked:
// the caller's goroutine is unwinding the lead's own panic already.
type leadPanic struct{}

// judge takes attempt t out of flight, classifies it, reports it to the
// mechanisms, and records a first attempt's latency for the adaptive
// delay.
func (h *hedgeCall) judge(t *hedgeTry) outcome {
	c := h.c
	h.flight = slices.DeleteFunc(h.flight, func(f *hedgeTry) bool { return f == t })
	reported := false
	defer func() {
		if !reported {
			// The classification panicked (an error whose GRPCStatus
			// panics, a clock): out of flight already, the attempt is
			// reported here, as the plain call's are, so that no
			// mechanism keeps a slot for it (a half-open probe's).
			t.cancel()
			c.report(&t.a, panicked)
		}
	}()
	now := c.cfg.now()
	t.took = now.Sub(t.start)
	var o outcome
	switch {
	case t.panicked:
		o = panicked
	case t.ours && status.Code(t.err) == codes.Canceled:
		o = cancelledByUs
	default:
		t.a.timedOut = t.err != nil && c.ownTimeout(t.ctx, t.err, now)
		o = c.classify(&t.a, t.err, t.trailer)
	}
	t.cancel()
	reported = true // before report: a mechanism's own panic is not reported twice
	c.report(&t.a, o)
	if h.target != nil && t.a.n == 0 && (o.kind == outcomeSuccess || o.kind == outcomeAnswer || o == cancelledByUs) {
		// A first attempt cancelled for a hedge's answer counts with the
		// time it had run: it was at least that slow, which keeps the
		// percentile where it is instead of learning only the fast ones.
		h.target.delay.Record(t.took)
	}
	return o
}

// answer ends the call with attempt t's answer, o, once the other
// attempts returned: the caller's reply and options get t's.
func (h *hedgeCall) answer(t *hedgeTry, o outcome) error {
	c := h.c
	if t.isHedge {
		if t.err == nil { // a win is an answer; a fast failure is none
			h.target.count(c.cfg.now(), true)
		}
		c.observe(Event{Kind: EventHedgeWon, Attempt: int(t.a.n), Code: o.code})
		h.deliver(t)
		if t.err == nil {
			copyReply(h.reply, t.reply)
		}
	}
	if t.err == nil {
		return nil
	}
	_, err := c.next(t.err, o)
	return err
}

// deliver gives the caller's header, trailer and peer options those of
// hedge t (the lead's options are the caller's own).
func (h *hedgeCall) deliver(t *hedgeTry) {
	if !t.isHedge {
		return
	}
	for _, p := range h.user.header {
		*p = t.header
	}
	for _, p := range h.user.trailer {
		*p = t.trailer
	}
	for _, p := range h.user.peer {
		*p = t.peer
	}
}

// cancelAll cancels the attempts in flight and waits until each
// returned, so that none writes into the caller's reply any more. A
// panic of a hedge is raised once all returned.
func (h *hedgeCall) cancelAll() {
	for _, t := range h.flight {
		t.ours = true
		t.stop()
	}
	var raise *hedgeTry
	for len(h.flight) > 0 {
		t := <-h.results
		h.judge(t)
		h.c.observe(Event{Kind: EventHedgeCancelled, Attempt: int(t.a.n)})
		if t.panicked && raise == nil {
			raise = t
		}
	}
	if raise != nil {
		h.raise(raise)
	}
}

// abort, after a panic of the coordinator, cancels the attempts in
// flight and waits for them, and tells the mechanisms that each
// counts for nothing (a half-open breaker's probe must not keep its
// slot).
func (h *hedgeCall) abort() {
	for _, t := range h.flight {
		t.stop()
	}
	for ; len(h.flight) > 0; h.flight = h.flight[1:] {
		t := <-h.results
		t.cancel()
		h.c.report(&t.a, panicked)
	}
}

// startTick starts the wait for the next hedge, replacing the one
// pending. Each wait ticks on a channel of its own: a tick of the one
// replaced, which came already (while the coordinator was busy) or is on
// its way (its timer expired, and its function runs late, on a goroutine
// of its own), goes where no one listens, so that a pushback is waited
// in full.
func (h *hedgeCall) startTick(d time.Duration) {
	h.stopTick()
	h.waited = d
	tick := make(chan struct{}, 1)
	h.tick = tick
	h.tickStop = h.c.cfg.after(d, func() { tick <- struct{}{} })
}

// stopTick ends the wait for the next hedge: none ticks after it (a nil
// channel is never ready).
func (h *hedgeCall) stopTick() {
	if h.tickStop != nil {
		h.tickStop.Stop()
		h.tickStop = nil
	}
	h.tick = nil
}
