package interceptor

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// The unary retry loop.
//
// Its stack frame is kept small on purpose: the invoker runs below it,
// and in a handler's call to the next tier the whole handler's stack is
// below that, on a goroutine grpc-go starts per request. A frame that
// pushes such a goroutine's deepest point past its stack's size makes
// the runtime copy the whole stack on every request: a pass-through
// interceptor with 512 bytes of locals on each side of a middle tier
// cost 13 % more CPU per request on the silent check's chain than one
// with 256 (BENCHMARKS.md, "What a call costs"). So unary holds only
// what the invoker needs; the state is in unaryCall, and the work before
// and after each attempt is done in calls whose frames are gone while
// the invoker runs.

// unaryCall is the state of one unary call: the retry state, and the
// call options with the header and trailer options added, in one
// allocation. It is not pooled: an interceptor further in that returned
// before its invoker did could still write the header or trailer into it.
type unaryCall struct {
	call
	cur     attempt
	actx    context.Context    // the current attempt's
	cancel  context.CancelFunc // its per-attempt timeout
	header  metadata.MD
	trailer metadata.MD
	hopt    grpc.HeaderCallOption
	topt    grpc.TrailerCallOption
	opts    []grpc.CallOption
	optsBuf [4]grpc.CallOption // the call's options (usually none) and our two
	out     mdContext          // the first attempt's context (see withShared)
}

func (cl *client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	u, hu, ht, err := cl.newUnary(ctx, method, reply, cc, opts)
	if hu != nil {
		return hu.run(ht, method, req, reply, cc, invoker, opts)
	}
	if u == nil {
		return err // invalid per-call options
	}
	defer u.panicked()
	for {
		actx, err := u.begin()
		if err != nil {
			return err
		}
		err = invoker(actx, method, req, reply, cc, u.opts...)
		if done, err := u.end(err); done {
			return err
		}
	}
}

// newUnary prepares a unary call: a plain one, or one that hedges (see
// hedgedUnary) with the hedging state of its target, or the error of
// invalid per-call options. (unary runs a hedged call, not newUnary:
// newUnary's frame is large, and gone by then.)
func (cl *client) newUnary(ctx context.Context, method string, reply any, cc *grpc.ClientConn, opts []grpc.CallOption) (*unaryCall, *hedgedUnary, *hedgeTarget, error) {
	cfg, err := cl.callConfig(opts)
	if err != nil {
		return nil, nil, nil, err
	}
	// The call is built where it stays, not copied there: a copy of its
	// pointers costs a write barrier each while the collector runs.
	var u *unaryCall
	if cfg.hedging.hedges(method) && hedgeableReply(reply) {
		// The hedged call's state is several times the size of a plain
		// call's: made only for a method configured to hedge. Below a
		// tier that hedges (its mark says so) the call runs plain in it.
		hu := &hedgedUnary{}
		u = &hu.unaryCall
		cl.initCall(&u.call, ctx, cfg, cc, method)
		if u.hedges() { // not below a tier that hedges, which the mark tells
			if ht := cfg.delays.get(u.key, method); ht != nil { // nil: too many methods at the target
				return nil, hu, ht, nil
			}
		}
	} else {
		u = &unaryCall{}
		cl.initCall(&u.call, ctx, cfg, cc, method)
	}
	u.hopt.HeaderAddr = &u.header
	u.topt.TrailerAddr = &u.trailer
	u.opts = append(append(u.optsBuf[:0], opts...), &u.hopt, &u.topt)
	return u, nil, nil, nil
}

// initCall prepares c, a zero call, for a call to method on cc.
func (cl *client) initCall(c *call, ctx context.Context, cfg *config, cc *grpc.ClientConn, method string) {
	c.init(ctx, cfg, cl.target(cc), method)
	c.conn = cc
}

// begin asks the mechanisms whether the call's next attempt may go out
// and returns its context, or the call's final error.
func (u *unaryCall) begin() (context.Context, error) {
	c, a := &u.call, &u.cur
	*a = attempt{}
	if err := c.begin(a); err != nil {
		return nil, err
	}
	u.cancel = nil // a panic in attemptContext: see panicked
	u.call.running = true
	u.actx, u.cancel = c.attemptContext(true, &u.out)
	u.header, u.trailer = nil, nil
	return u.actx, nil
}

// end judges the attempt that ended with err and tells the mechanisms;
// it reports whether the call is over, with its error (nil on success),
// or else waits for the next attempt.
//
// gRFC A6: an attempt whose response headers arrived committed the call,
// and is not retried whatever its status. gRPC fills the header option
// with a non-nil MD when headers arrived, and leaves it nil for a
// trailers-only response (a server that failed before sending headers),
// which stays retryable.
func (u *unaryCall) end(err error) (bool, error) {
	c, a := &u.call, &u.cur
	a.timedOut = err != nil && c.ownTimeout(u.actx, err, c.cfg.now())
	c.committed = u.header != nil
	o := c.classify(a, err, u.trailer)
	u.call.running = false
	u.cancel()
	c.report(a, o)
	wait, err := c.next(err, o)
	if err != nil || wait < 0 {
		return true, err
	}
	if c.cfg.sleep(c.ctx, wait) != nil {
		return true, c.canceled()
	}
	return false, nil
}

// panicked runs when unary returns: if an attempt was still running, the
// invoker (an interceptor further in, a codec) panicked, and a recovery
// interceptor further out may turn that into an error; the mechanisms
// must hear of the attempt all the same, or a half-open probe would
// keep its slot forever.
func (u *unaryCall) panicked() {
	if u.call.running {
		u.call.running = false
		if u.cancel != nil {
			u.cancel()
		}
		u.report(&u.cur, panicked)
	}
}
