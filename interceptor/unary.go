package interceptor

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// unaryCall is the state of one unary call: the retry state, and the
// call options with the header and trailer options added, in one
// allocation. It is not pooled: an interceptor further in that returned
// before its invoker did could still write the header or trailer into it.
type unaryCall struct {
	call
	cur     attempt
	header  metadata.MD
	trailer metadata.MD
	hopt    grpc.HeaderCallOption
	topt    grpc.TrailerCallOption
	optsBuf [4]grpc.CallOption // the call's options (usually none) and our two
}

func (cl *client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	cfg, err := cl.callConfig(opts)
	if err != nil {
		return err
	}
	var hu *hedgedUnary
	var u *unaryCall
	if cfg.hedging.hedges(method) && hedgeableReply(reply) {
		hu = &hedgedUnary{}
		u = &hu.unaryCall
	} else {
		u = &unaryCall{}
	}
	u.init(ctx, cfg, cl.target(cc), method)
	u.conn = cc
	if hu != nil && u.hedges() {
		if ht := cfg.delays.get(u.key, method); ht != nil { // nil: too many methods at the target
			return hu.run(ht, method, req, reply, cc, invoker, opts)
		}
	}
	c := &u.call
	u.hopt.HeaderAddr = &u.header
	u.topt.TrailerAddr = &u.trailer
	opts = append(append(u.optsBuf[:0], opts...), &u.hopt, &u.topt)
	for {
		wait, err := u.attempt(method, req, reply, cc, invoker, opts)
		if err != nil || wait < 0 {
			return err
		}
		if err := c.cfg.sleep(ctx, wait); err != nil {
			return c.canceled()
		}
	}
}

// attempt makes one attempt, if the mechanisms allow it, and judges it:
// it returns the wait before the next attempt, or a negative wait and
// the call's final error (nil on success).
//
// The mechanisms hear of the attempt on every way out: a panic in the
// invoker (an interceptor further in, a codec) that a recovery
// interceptor further out turns into an error must not keep a half-open
// probe's slot forever.
//
// gRFC A6: an attempt whose response headers arrived committed the call,
// and is not retried whatever its status. gRPC fills the header option
// with a non-nil MD when headers arrived, and leaves it nil for a
// trailers-only response (a server that failed before sending headers),
// which stays retryable.
func (u *unaryCall) attempt(method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) (time.Duration, error) {
	c, a := &u.call, &u.cur
	*a = attempt{}
	if err := c.begin(a); err != nil {
		return -1, err
	}
	reported := false
	defer func() {
		if !reported { // only on a panic
			c.report(a, panicked)
		}
	}()
	actx, cancel := c.attemptContext(true)
	defer cancel()
	u.header, u.trailer = nil, nil
	err := invoker(actx, method, req, reply, cc, opts...)
	a.timedOut = err != nil && c.ownTimeout(actx, err, c.cfg.now())
	c.committed = u.header != nil
	o := c.classify(a, err, u.trailer)
	reported = true
	c.report(a, o)
	return c.next(err, o)
}
