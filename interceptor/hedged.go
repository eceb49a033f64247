package interceptor

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/hedge"
)

// This file is the retry loop of a hedged unary call (WithHedging). Its
// attempts run on goroutines of their own; everything else, the
// mechanisms above all, runs on the caller's goroutine, which waits for
// the first of: an attempt's end, the time for the next attempt.

// hedgeTry is one attempt of a hedged call, with its own context,
// reply, header and trailer, so that attempts in flight at once share
// nothing.
type hedgeTry struct {
	a        attempt
	ctx      context.Context
	cancel   context.CancelFunc
	reply    any // the caller's, or a fresh one (see launch)
	header   metadata.MD
	trailer  metadata.MD
	peer     peer.Peer
	hopt     grpc.HeaderCallOption
	topt     grpc.TrailerCallOption
	popt     grpc.PeerCallOption
	start    time.Time
	err      error
	panicVal any  // what the invoker panicked with, re-raised on the caller's goroutine
	panicked bool // the invoker panicked
	ours     bool // we cancelled it: another attempt answered
	hedge    bool // sent as a hedge, while another attempt was in flight
}

// hedgeCall is the state of a hedged call.
type hedgeCall struct {
	c       *call
	method  string
	req     any
	reply   any // the caller's
	cc      *grpc.ClientConn
	invoker grpc.UnaryInvoker
	opts    []grpc.CallOption // the caller's, without user
	user    userOptions
	delay   *hedge.Delay // adaptive, or nil

	results   chan *hedgeTry
	flight    []*hedgeTry
	replyBusy bool // an attempt in flight writes into the caller's reply
	hedges    int  // hedges sent
	noHedges  bool // no more hedges: refused, or "do not retry"
	dontRetry bool // an attempt answered "do not retry"
	last      *hedgeTry

	due      <-chan time.Time // the next attempt's time, nil for none
	stopDue  func() bool
	dueDelay time.Duration
	retryAt  bool // the next attempt is a retry (none in flight), not a hedge
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
		switch o := o.(type) {
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

// hedged runs the call c with hedges.
func (u *unaryCall) hedged(method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	c := &u.call
	h := &hedgeCall{c: c, method: method, req: req, reply: reply, cc: cc, invoker: invoker}
	h.opts, h.user = splitOptions(opts)
	h.results = make(chan *hedgeTry, c.max)
	if c.cfg.hedging.delay == 0 {
		h.delay = c.cfg.delays.get(c.key, method)
	}
	c.hedging = true
	defer h.stopTimer()
	if r := h.launch(false); r != 0 {
		return c.stop(r)
	}
	for {
		done, err := h.step()
		if done {
			return err
		}
	}
}

// step waits for the next thing to happen and handles it; it reports
// whether the call is over, with its error.
func (h *hedgeCall) step() (bool, error) {
	var cancelled <-chan struct{}
	if len(h.flight) == 0 { // waiting to retry: the caller may leave
		cancelled = h.c.ctx.Done()
	}
	select {
	case t := <-h.results:
		return h.ended(t)
	case <-h.due:
		h.due, h.stopDue = nil, nil
		return h.fire()
	case <-cancelled:
		return true, h.c.canceled()
	}
}

// launch sends the call's next attempt, a hedge or not, if the
// mechanisms allow it: zero, or why one refused it.
func (h *hedgeCall) launch(isHedge bool) StopReason {
	c := h.c
	t := &hedgeTry{hedge: isHedge}
	if r := c.admit(&t.a); r != 0 {
		return r
	}
	c.hedgeNext = isHedge
	actx, cancel := c.attemptContext(true)
	c.hedgeNext = false
	ctx, stop := context.WithCancel(actx)
	t.ctx, t.cancel = ctx, func() { stop(); cancel() }
	t.reply = h.reply
	if h.replyBusy {
		t.reply = freshReply(h.reply)
	}
	h.replyBusy = true
	t.hopt.HeaderAddr, t.topt.TrailerAddr, t.popt.PeerAddr = &t.header, &t.trailer, &t.peer
	opts := append(h.opts[:len(h.opts):len(h.opts)], t.hopt, t.topt, t.popt)
	t.start = c.cfg.now()
	h.flight = append(h.flight, t)
	go h.run(t, opts)
	if c.attempt < c.max && h.hedges < c.cfg.hedging.maxHedges && !h.noHedges {
		h.setDue(c.hedgeDelay(h.delay), false)
	}
	return 0
}

// run is an attempt's goroutine: it makes the attempt and hands it back.
// A panic in the invoker is handed back too, to be raised again on the
// caller's goroutine, where a recovery interceptor further out sees it.
func (h *hedgeCall) run(t *hedgeTry, opts []grpc.CallOption) {
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

// ended handles the end of attempt t.
func (h *hedgeCall) ended(t *hedgeTry) (bool, error) {
	c := h.c
	o := h.judge(t)
	if t.panicked {
		h.cancelAll()
		panic(t.panicVal)
	}
	h.last = t
	committed := t.header != nil
	if t.err == nil || committed || !o.mayRetry() {
		// The call's answer (gRFC A6): a success, a commit, a code that is
		// not retried. The other attempts are cancelled.
		c.committed = committed
		h.cancelAll()
		return true, h.answer(t, o)
	}
	c.last = t.err
	if o.saysDontRetry() {
		h.dontRetry, h.noHedges = true, true
	}
	if len(h.flight) > 0 {
		if o.hasPushback && o.pushback >= 0 && !h.retryAt {
			h.setDue(c.wait(o), false) // the next hedge waits the pushback
		}
		return false, nil // an attempt in flight may still answer
	}
	h.stopTimer()
	if h.dontRetry && !o.saysDontRetry() {
		h.deliver(t)
		return true, c.stop(StopPushback)
	}
	wait, err := c.next(t.err, o)
	if err != nil {
		h.deliver(t)
		return true, err
	}
	h.setDue(wait, true)
	return false, nil
}

// judge takes attempt t out of flight, classifies it, reports it to the
// mechanisms, and records a first attempt's latency for the adaptive
// delay.
func (h *hedgeCall) judge(t *hedgeTry) outcome {
	c := h.c
	h.flight = slices.DeleteFunc(h.flight, func(f *hedgeTry) bool { return f == t })
	if t.reply == h.reply {
		h.replyBusy = false
	}
	now := c.cfg.now()
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
	c.report(&t.a, o)
	if h.delay != nil && t.a.n == 0 && (o.kind == outcomeSuccess || o.kind == outcomeAnswer || o == cancelledByUs) {
		// A first attempt cancelled for a hedge's answer counts with the
		// time it had run: it was at least that slow, which keeps the
		// percentile where it is instead of learning only the fast ones.
		h.delay.Record(now.Sub(t.start))
	}
	return o
}

// fire sends the attempt that is due: a retry when none is in flight, or
// a hedge if every mechanism allows one.
func (h *hedgeCall) fire() (bool, error) {
	c := h.c
	if h.retryAt {
		if r := h.launch(false); r != 0 {
			return true, c.stop(r)
		}
		return false, nil
	}
	if h.noHedges {
		return false, nil
	}
	r := h.mayHedge()
	if r == 0 {
		h.hedges++
		if r = h.launch(true); r == 0 {
			c.observe(Event{Kind: EventHedgeSent, Attempt: c.attempt - 1, Delay: h.dueDelay})
			return false, nil
		}
		h.hedges--
	}
	// The attempts in flight still answer the call.
	h.noHedges = true
	c.observe(Event{Kind: EventHedgeRefused, Attempt: c.attempt, Reason: r})
	return false, nil
}

// mayHedge reports why the call may not send a hedge now, or zero.
func (h *hedgeCall) mayHedge() StopReason {
	c := h.c
	if c.attempt >= c.max {
		return StopAttempts
	}
	if dl, ok := c.ctx.Deadline(); ok && !roomForRetry(time.Until(dl), 0) {
		return StopDeadline
	}
	for _, m := range c.mechanisms() {
		if r := m.retry(c); r != 0 {
			return r
		}
	}
	return 0
}

// answer ends the call with attempt t's answer, o, once the other
// attempts returned: the caller's reply and options get t's.
func (h *hedgeCall) answer(t *hedgeTry, o outcome) error {
	c := h.c
	if t.hedge {
		c.observe(Event{Kind: EventHedgeWon, Attempt: t.a.n, Code: o.code})
	}
	h.deliver(t)
	if t.err == nil {
		if t.reply != h.reply {
			copyReply(h.reply, t.reply)
		}
		return nil
	}
	_, err := c.next(t.err, o)
	return err
}

// deliver gives the caller's header, trailer and peer options attempt
// t's.
func (h *hedgeCall) deliver(t *hedgeTry) {
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
// panic of one is raised once all returned.
func (h *hedgeCall) cancelAll() {
	for _, t := range h.flight {
		t.ours = true
		t.cancel()
	}
	var pv any
	var raise bool
	for len(h.flight) > 0 {
		t := <-h.results
		h.judge(t)
		h.c.observe(Event{Kind: EventHedgeCancelled, Attempt: t.a.n})
		if t.panicked && !raise {
			pv, raise = t.panicVal, true
		}
	}
	if raise {
		panic(pv)
	}
}

// setDue starts the wait for the next attempt, a retry or a hedge.
func (h *hedgeCall) setDue(d time.Duration, retry bool) {
	h.stopTimer()
	h.due, h.stopDue = h.c.cfg.timer(d)
	h.dueDelay, h.retryAt = d, retry
}

func (h *hedgeCall) stopTimer() {
	if h.stopDue != nil {
		h.stopDue()
		h.due, h.stopDue = nil, nil
	}
}
