package interceptor

import (
	"context"
	"errors"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/admission"
)

// MetadataShed marks an answer as admission control's: the server
// refused the request to protect itself, and is alive (busy, not broken).
// It concerns the tier that was refused only: a tier that gives up on
// such an answer tells its own caller "do not retry" without it (protocol
// version 2; version 1 passed it up the chain, and the throttles of
// healthy tiers above took their neighbours for overloaded). A stormguard
// client does not count a busy answer against its circuit breaker, and
// its adaptive throttle counts it as not accepted (which sheds only
// while the target accepts nothing) but never calls the target down
// (adaptive.Busy); the retry limiters hear it as a failure (WithThrottle's
// bucket takes a token; the budget ignores outcomes).
const MetadataShed = "x-stormguard-shed"

// shedMarked reports whether trailer carries MetadataShed.
func shedMarked(trailer metadata.MD) bool { return len(trailer[MetadataShed]) > 0 }

// dontRetryShed is the trailer of a refusal that no retry can help.
var dontRetryShed = metadata.Pairs(MetadataPushback, "-1", MetadataShed, "1")

// WithAdmission puts the server interceptors behind admission control
// (see admission.Limiter), checked before the handler runs. Server side.
//
// It refuses a request only while the server is overloaded, that is while
// requests arrive faster than they complete, and then only one that would
// wait longer than the latency target (admission.Config.Target, 20 ms, less
// for retries and callers already retrying, which go first) or than its
// own deadline. A server at capacity loaded by a fixed number of callers,
// however long its latency, or a tier whose latency is its dependency's,
// is never refused anything. It also refuses, before its handler runs, a
// request whose caller is gone (codes.Canceled or DeadlineExceeded, no
// trailer); and, with admission.Config.MaxInFlight, a request over that
// fixed cap (with a queue, after waiting in it). A refusal is
// codes.Unavailable with the trailer MetadataShed and
// grpc-retry-pushback-ms:
//
//   - a delay of about the latency target (jittered between half and one
//     and a half of it, at least 1 ms) for a request refused while
//     overloaded or at the cap, whatever its class: a retry after that,
//     on another replica (one weak replica of several) or here, may
//     succeed, and a caller that honours the pushback pauses instead of
//     coming back at once. The caller's retry budget bounds what that
//     costs an overloaded server: a refusal, cheap, per retry;
//   - -1 ("do not retry") when the server is overloaded and the deadline
//     is too short for the latency it expects (no retry can beat it).
//
// Why Unavailable rather than ResourceExhausted: the request was not
// processed, so a retry is safe, which is what Unavailable means ("a
// transient condition, corrected by retrying with a backoff"); it is the
// code that stormguard's, grpc-go's and go-grpc-middleware's retries
// retry, so the pushback decides: stormguard and grpc-go's built-in retry
// wait the delay or stop at -1, and go-grpc-middleware, which ignores
// pushback, retries into the retry class, which is refused first and
// cheaply. ResourceExhausted usually means a quota, which no retry fixes.
//
// Streams: a stream's start is admitted or refused like a unary call, but
// the stream holds no slot and counts for nothing while it stays open (a
// watch may stay open for hours at no cost): an overloaded server opens
// no new streams, and sheds retried ones first, but the overload rule
// sees unary calls only, so a server whose load comes from messages on
// open streams is not protected by it.
//
// The limit is the server's, across its methods: while one method's
// calls queue (its dependency is slow), every method's new calls and
// streams are refused, also those that would not touch it (a streaming
// user's trial: watches that never touch the queueing pool, 31-46 % of
// their opens refused at the tier above it). Give such methods their own
// server, or leave admission control off where methods depend on
// different backends.
//
// An invalid cfg makes New fail. The limiter lives in the option: pass the
// same Option value to both server interceptors to share one limit.
func WithAdmission(cfg admission.Config) Option {
	l, err := admission.New(cfg)
	return setupOption("WithAdmission", func(c *config) error {
		if err != nil {
			return invalid("WithAdmission: %v", err)
		}
		c.admission = l
		return nil
	})
}

// Admission returns the admission limiter (WithAdmission), or nil, for
// metrics such as the limit and the requests in flight.
func (i *Interceptors) Admission() *admission.Limiter { return i.server.admission }

// AdmissionReason says why admission control refused a request
// (EventAdmissionRefused).
type AdmissionReason int

// The reasons admission control refuses a request.
const (
	// AdmissionLimit: the requests in flight reached
	// admission.Config.MaxInFlight for the request's class.
	AdmissionLimit AdmissionReason = iota + 1
	// AdmissionDeadline: the server was overloaded and the remaining
	// deadline was shorter than the latency the request could expect.
	AdmissionDeadline
	// AdmissionCallerGone: the caller had canceled or its deadline had
	// passed (before the request could start, or while it waited in the
	// queue).
	AdmissionCallerGone
	// AdmissionQueueTimeout: the request waited in the queue
	// (admission.Config.QueueSize) for the longest wait without getting
	// a slot.
	AdmissionQueueTimeout
	// AdmissionOverload: the server was overloaded (requests arrived
	// faster than they completed) and the request would have waited
	// longer than the latency target of its class.
	AdmissionOverload
)

var admissionReasonNames = map[AdmissionReason]string{
	AdmissionLimit:        "limit",
	AdmissionDeadline:     "deadline",
	AdmissionCallerGone:   "caller_gone",
	AdmissionQueueTimeout: "queue_timeout",
	AdmissionOverload:     "overload",
}

func (r AdmissionReason) String() string {
	if s, ok := admissionReasonNames[r]; ok {
		return s
	}
	return "AdmissionReason(" + strconv.Itoa(int(r)) + ")"
}

// admissionGuard is admission control as a mechanism of the server
// interceptors.
type admissionGuard admission.Limiter

func (g *admissionGuard) limiter() *admission.Limiter { return (*admission.Limiter)(g) }

// done releases a unary call's slot when its handler returned err: a
// success is a sample of the server's latency, a failure (a panic
// included) a completion only, since fast failures would make the latency
// look shorter than it is, and an answer after the caller left (its
// deadline ran out, or it cancelled), success or not, is abandoned: it
// ended, but the server served no one (see admission.Abandoned). So is
// a DeadlineExceeded while the caller waits: a call of the handler's
// timed out (a slow or hung dependency), which is no fast failure: read
// as one, a middle tier took its calls' timeouts for a failing
// dependency and let in every request it held at once. And a handler
// whose queue ignores cancellation (a FIFO pool) answers requests whose
// callers timed out: read as successes, its slow answers made it look
// busy but useful, and the limiter kept the queue its callers had given
// up on.
//
// A unary call's answer then waits while the limiter holds its answers
// (admission.Limiter.HoldAnswer: at most 80 ms, once per suspect phase
// that runs out within 100 windows of a closed loop of callers found, or
// with no deadline of a second or less among its waiting callers), so
// that a load test ramping its callers up is told from an open-loop
// overload without refusing any of them. A stream, whose slot was
// given back when it began, and a handler that panicked are not held.
func (g *admissionGuard) done(_ *server, sc *stateCtx, err error) {
	p := sc.st.permit
	if p == (admission.Permit{}) {
		return // a stream's: released at its start
	}
	sc.st.permit = admission.Permit{}
	switch {
	case err == errNotRun:
		p.Release(admission.Ignored)
		return
	case sc.Err() != nil || status.Code(err) == codes.DeadlineExceeded:
		p.Release(admission.Abandoned)
		return
	case err == nil:
		p.Release(admission.Measured)
	default:
		p.Release(admission.Failed)
	}
	if err != errPanicked {
		g.limiter().HoldAnswer(sc)
	}
}

// admit asks the limiter whether the request sc serves may run. A unary
// call holds its slot until its handler returns; a stream's start only
// takes one and releases it at once, counting for nothing (see
// WithAdmission). On a refusal it sets the pushback trailer (on ss, or on
// the unary call when ss is nil) and returns the error the call must end
// with.
func (g *admissionGuard) admit(s *server, sc *stateCtx, method string, ss grpc.ServerStream) error {
	l := g.limiter()
	if err := sc.Err(); err != nil {
		err = status.FromContextError(err).Err()
		s.refused(sc, method, AdmissionCallerGone, status.Code(err), 0)
		return err
	}
	dl, _ := sc.Deadline()
	class, heldAbove := admission.ClassFirst, false
	// The class decides only what is refused, and the held mark only
	// what is held (protocol 2.7), so the metadata is read only when
	// something may be.
	if refusing := l.Overloaded() || l.Limit() > 0; refusing || l.Suspect() {
		in := sc.st.Info()
		heldAbove = in.Held
		if refusing {
			class = admission.ClassOf(in.Attempt, in.UpstreamRetries)
			if in.Hedge {
				class = admission.ClassHedge
			}
		}
	}
	var p admission.Permit
	var err error
	if heldAbove {
		p, err = l.WaitHeld(sc, class, dl)
	} else {
		p, err = l.Wait(sc, class, dl)
	}
	switch {
	case err == nil && ss != nil:
		p.Release(admission.Ignored)
		return nil
	case err == nil:
		sc.st.permit = p
		sc.st.markAdmitted(p)
		return nil
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		// The caller left while the request waited in the queue.
		err = status.FromContextError(err).Err()
		s.refused(sc, method, AdmissionCallerGone, status.Code(err), 0)
		return err
	}
	return s.refuse(sc, method, ss, l, err)
}

// refuse answers a request that the limiter refused with err: the
// pushback trailer with the shed mark, the event, and the error.
func (s *server) refuse(sc *stateCtx, method string, ss grpc.ServerStream, l *admission.Limiter, err error) error {
	reason, pb, msg := AdmissionDeadline, int64(-1), "stormguard: admission: overloaded, deadline shorter than the expected latency"
	retryHere := true
	switch {
	case errors.Is(err, admission.ErrOverload):
		reason, msg = AdmissionOverload, "stormguard: admission: overloaded"
	case errors.Is(err, admission.ErrLimit):
		reason, msg = AdmissionLimit, "stormguard: admission: concurrency limit reached"
	case errors.Is(err, admission.ErrQueueTimeout):
		reason, msg = AdmissionQueueTimeout, "stormguard: admission: timed out in the queue"
	default:
		retryHere = false
	}
	if retryHere {
		pb = s.pushback(l.Config().Target)
	}
	md := dontRetryShed
	if pb >= 0 {
		md = metadata.Pairs(MetadataPushback, strconv.FormatInt(pb, 10), MetadataShed, "1")
	}
	if ss != nil {
		ss.SetTrailer(md)
	} else {
		_ = grpc.SetTrailer(sc, md)
	}
	s.refused(sc, method, reason, codes.Unavailable, time.Duration(pb)*time.Millisecond)
	return status.Error(codes.Unavailable, msg)
}

// pushback returns the delay, in milliseconds, that a refused first
// attempt's caller should wait: the latency target, jittered between half
// and one and a half of it so that refused callers do not come back in
// step, at least 1 ms.
func (s *server) pushback(target time.Duration) int64 {
	u := 0.5
	if s.rand != nil {
		u = s.rand()
	}
	return max(int64(float64(target.Milliseconds())*(0.5+u)), 1)
}

// refused reports a refusal to the observer.
func (s *server) refused(sc *stateCtx, method string, r AdmissionReason, code codes.Code, pushback time.Duration) {
	if s.observer != nil {
		s.observer.Observe(sc, Event{Kind: EventAdmissionRefused, Method: method, Code: code, Delay: pushback, Admission: r, Info: sc.st.Info()})
	}
}
