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

// MetadataShed marks an answer as admission control's: the server (or,
// passed up by the tiers above it, a server further down the chain)
// refused the request to protect itself, and is alive. A stormguard client
// does not count such an answer against its circuit breaker: the server's
// own limit already sheds the load, and a breaker that opened on it would
// refuse the share the server can still serve, and hold users out after
// the overload ends. The retry budget still counts it as a failure.
const MetadataShed = "x-stormguard-shed"

// shedMarked reports whether trailer carries MetadataShed.
func shedMarked(trailer metadata.MD) bool { return len(trailer[MetadataShed]) > 0 }

// dontRetryShed is the "do not retry" trailer of a shed answer.
var dontRetryShed = metadata.Pairs(MetadataPushback, "-1", MetadataShed, "1")

// dontRetryTrailer returns the "do not retry" trailer for a handler's
// answer, with MetadataShed when the call that gave up was shed.
func (st *serverState) dontRetryTrailer() metadata.MD {
	if st.shed.Load() {
		return dontRetryShed
	}
	return dontRetry
}

// WithAdmission puts the server interceptors behind admission control: an
// adaptive concurrency limit derived from latency (see admission.Limiter),
// checked before the handler runs. Server side.
//
// A request is refused, before its handler runs, when its caller is gone
// (codes.Canceled or DeadlineExceeded, no trailer), when the server is at
// the limit for the request's class (retries and callers already retrying
// are refused first, see admission.Class), or when its remaining deadline
// is shorter than the latency the server currently needs. With a queue
// (admission.Config.QueueSize, off by default), a request that meets a
// full limit first waits in it (see admission.Limiter.Wait), and is
// refused when its wait times out or its caller leaves. A refusal is
// codes.Unavailable with the trailer MetadataShed and
// grpc-retry-pushback-ms:
//
//   - a delay of one current latency (at least 1 ms) when a first attempt
//     met the limit or timed out in the queue: the server was briefly full, and a retry, here or
//     elsewhere, may succeed;
//   - -1 ("do not retry") when a retry or a caller already retrying met
//     the limit (the server is overloaded by retries), or when the
//     deadline is too short (no retry can beat it).
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
// A stream is admitted or refused at its start like a unary call, but
// does not hold a slot while it stays open: the limit counts unary calls
// (and streams being started), so long-lived streams cannot lock the
// server out.
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
	// AdmissionLimit: the requests in flight reached the limit for the
	// request's class.
	AdmissionLimit AdmissionReason = iota + 1
	// AdmissionDeadline: the remaining deadline was shorter than the
	// latency the server needs.
	AdmissionDeadline
	// AdmissionCallerGone: the caller had canceled or its deadline had
	// passed (before the request could start, or while it waited in the
	// queue).
	AdmissionCallerGone
	// AdmissionQueueTimeout: the request waited in the queue
	// (admission.Config.QueueSize) for the longest wait without getting
	// a slot.
	AdmissionQueueTimeout
)

var admissionReasonNames = map[AdmissionReason]string{
	AdmissionLimit:        "limit",
	AdmissionDeadline:     "deadline",
	AdmissionCallerGone:   "caller_gone",
	AdmissionQueueTimeout: "queue_timeout",
}

func (r AdmissionReason) String() string {
	if s, ok := admissionReasonNames[r]; ok {
		return s
	}
	return "AdmissionReason(" + strconv.Itoa(int(r)) + ")"
}

// admitted is an admitted request; the zero value (no admission control)
// does nothing.
type admitted struct{ p admission.Permit }

// done releases the request's slot: a unary call's when its handler
// returned, with its latency; a stream's as soon as it was admitted, with
// no latency. Admission control admits a stream's start (an overloaded
// server opens no new streams, and sheds retried ones first) but does not
// count the stream against the limit for its life: a watch or
// subscription may stay open for hours while costing nothing, so its life
// is not a request's latency; and streams that held slots would, once as
// many were open as the limit, refuse every other request for good, with
// no measured request left to raise the limit.
func (a admitted) done(stream bool) {
	if stream {
		a.p.Release(admission.Ignored)
	} else {
		a.p.Release(admission.Measured)
	}
}

// admit asks the limiter whether the request sc serves may run. On a
// refusal it sets the pushback trailer (on ss, or on the unary call when
// ss is nil) and returns the error the call must end with.
func (s *server) admit(sc *stateCtx, method string, ss grpc.ServerStream) (admitted, error) {
	l := s.admission
	if l == nil {
		return admitted{}, nil
	}
	if err := sc.Err(); err != nil {
		err = status.FromContextError(err).Err()
		s.refused(sc, method, AdmissionCallerGone, status.Code(err), 0)
		return admitted{}, err
	}
	dl, _ := sc.Deadline()
	class := admission.ClassOf(sc.st.info.Attempt, sc.st.info.UpstreamRetries)
	p, err := l.Wait(sc, class, dl)
	if err == nil {
		return admitted{p: p}, nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The caller left while the request waited in the queue.
		err = status.FromContextError(err).Err()
		s.refused(sc, method, AdmissionCallerGone, status.Code(err), 0)
		return admitted{}, err
	}
	reason, pb, msg := AdmissionDeadline, int64(-1), "stormguard: admission: deadline shorter than the server's current latency"
	full := errors.Is(err, admission.ErrLimit)
	if full {
		reason, msg = AdmissionLimit, "stormguard: admission: concurrency limit reached"
	} else if errors.Is(err, admission.ErrQueueTimeout) {
		full, reason, msg = true, AdmissionQueueTimeout, "stormguard: admission: timed out in the queue"
	}
	if full && class == admission.ClassFirst {
		pb = max(l.Latency().Milliseconds(), 1)
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
	return admitted{}, status.Error(codes.Unavailable, msg)
}

// refused reports a refusal to the observer.
func (s *server) refused(sc *stateCtx, method string, r AdmissionReason, code codes.Code, pushback time.Duration) {
	if s.observer != nil {
		s.observer.Observe(sc, Event{Kind: EventAdmissionRefused, Method: method, Code: code, Delay: pushback, Admission: r, Info: sc.st.info})
	}
}
