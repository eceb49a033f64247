package interceptor

import (
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/breaker"
)

// This file is the one place that reads how an attempt ended and what
// that tells each mechanism. docs/protocol.md (section 4.3) has the same
// rules as a table, and TestOutcomeTable checks this code against it.

// outcomeKind is how an attempt ended, as every mechanism hears it.
type outcomeKind uint8

const (
	// outcomeNothing: the attempt says nothing about the target. Its
	// caller cancelled, or its caller's deadline expired after the target
	// had answered (a stream that answered, then ran long).
	outcomeNothing outcomeKind = iota
	// outcomeSuccess: the attempt succeeded.
	outcomeSuccess
	// outcomeAnswer: the target answered with a code that is no sign of
	// overload: it is alive and serving (NOT_FOUND, INTERNAL, a
	// DEADLINE_EXCEEDED of a tier below, ABORTED even where it is
	// retried).
	outcomeAnswer
	// outcomeOverload: UNAVAILABLE, from the target or from the channel
	// (no connection).
	outcomeOverload
	// outcomeTimeout: the attempt's own per-attempt timeout expired.
	outcomeTimeout
	// outcomeHang: the caller's deadline expired before the target
	// answered, the most expensive failure a target has.
	outcomeHang
	// outcomeBusy: the target's admission control refused the attempt
	// (MetadataShed): alive, protecting itself.
	outcomeBusy
	// outcomeDontRetry: "do not retry" on a retried code or an overload
	// code: a live target whose own dependency failed, and a tier below
	// already retried.
	outcomeDontRetry
	// outcomeDontRetryAnswer: "do not retry" on any other code: an answer
	// that changes nothing, except for a probe (see forBreaker).
	outcomeDontRetryAnswer
	// outcomeQuota: RESOURCE_EXHAUSTED: a quota (one user's), far more
	// often than an overload, or a message larger than a side accepts,
	// which the client itself may have raised without sending anything.
	// It says nothing about the target's health (see overloadCode); a
	// failure to the retry limiters only where the call retries it.
	outcomeQuota
)

var outcomeNames = [...]string{
	outcomeNothing:         "nothing",
	outcomeSuccess:         "success",
	outcomeAnswer:          "answer",
	outcomeOverload:        "overload",
	outcomeTimeout:         "timeout",
	outcomeHang:            "hang",
	outcomeBusy:            "busy",
	outcomeDontRetry:       "dont-retry",
	outcomeDontRetryAnswer: "dont-retry-answer",
	outcomeQuota:           "quota",
}

func (k outcomeKind) String() string { return outcomeNames[k] }

// ending is what is known when an attempt ends: its status, its trailer,
// the caller's context and whether the target had answered. It is plain
// data, so that the classification is a pure function.
type ending struct {
	code        codes.Code // OK for a success
	shed        bool       // the trailer carries MetadataShed
	pushback    int64      // the trailer's grpc-retry-pushback-ms, if hasPushback
	hasPushback bool
	// callerDone: the caller's context had ended; callerExpired: with its
	// deadline (not a cancel).
	callerDone, callerExpired bool
	// answered: the target had answered (a stream's header or message).
	answered bool
	// stream: the attempt is a stream's, whose target may rightly say
	// nothing for as long as it has nothing to send (a watch), so that
	// its caller's deadline running out first says nothing about it.
	stream bool
	// ownTimeout: a DEADLINE_EXCEEDED of the attempt's own per-attempt
	// timeout (see call.ownTimeout).
	ownTimeout bool
	// pastDeadline: the caller's deadline has passed, though its context
	// may not say so yet (see call.pastDeadline).
	pastDeadline bool
	// retried: code is retried: a configured code (WithCodes), or
	// DEADLINE_EXCEEDED of the attempt's own timeout, never another.
	retried bool
}

// outcome is a classified attempt: its kind, and what a retry needs of
// its trailer.
type outcome struct {
	kind        outcomeKind
	code        codes.Code
	retried     bool // see ending.retried
	pushback    int64
	hasPushback bool
}

// classify reads an ending. The rules apply in order; the first that
// matches decides.
func classify(e ending) outcome {
	o := outcome{code: e.code, retried: e.retried, pushback: e.pushback, hasPushback: e.hasPushback}
	o.kind = classifyKind(e)
	return o
}

func classifyKind(e ending) outcomeKind {
	switch {
	case e.code == codes.OK:
		return outcomeSuccess
	case e.callerDone && (!e.callerExpired || e.answered || e.stream):
		// A caller that cancelled says nothing about the target; nor does
		// a deadline that ran out on a stream: a watch whose target has
		// nothing to send sends nothing, not even its header.
		return outcomeNothing
	case e.shed:
		return outcomeBusy
	case e.hasPushback && e.pushback < 0 && (e.retried || overloadCode(e.code)):
		return outcomeDontRetry
	case e.hasPushback && e.pushback < 0:
		return outcomeDontRetryAnswer
	case e.callerDone:
		return outcomeHang // the caller's deadline, before any answer
	case overloadCode(e.code):
		return outcomeOverload
	case e.code == codes.ResourceExhausted:
		return outcomeQuota
	case e.code == codes.DeadlineExceeded && e.ownTimeout:
		return outcomeTimeout
	case e.code == codes.DeadlineExceeded && e.pastDeadline && !e.answered:
		// The server's timer fired before the caller's: a hang all the
		// same (see call.pastDeadline), or nothing for a stream.
		if e.stream {
			return outcomeNothing
		}
		return outcomeHang
	}
	return outcomeAnswer
}

// overloadCode reports whether code is one of overload: UNAVAILABLE.
// RESOURCE_EXHAUSTED is not (outcomeQuota): it is a quota far more often
// than an overload (one user's, whose refusals called a healthy target
// down for every other user of a tier), or a message larger than a side
// accepts; a server shedding load says UNAVAILABLE (stormguard's
// admission control, Envoy's).
func overloadCode(code codes.Code) bool {
	return code == codes.Unavailable
}

// failure reports whether the outcome is the target's failure, for the
// retry limiters (budget, A6 throttle): a busy answer counts too, since
// retrying into a refusing target is what a budget must bound.
func (k outcomeKind) failure() bool {
	switch k {
	case outcomeOverload, outcomeTimeout, outcomeHang, outcomeBusy, outcomeDontRetry:
		return true
	}
	return false
}

// forLimiter is what the retry limiters hear (budget.Limiter's
// RecordOutcome; ok false: nothing). As gRFC A6's throttle counts them in
// grpc-go, a failure with a code the client retries and any "do not
// retry" pushback are failures, and so are the target's overloads,
// timeouts, hangs and busy refusals; an OK is a success, and so is an
// answer with another code (grpc-go leaves its tokens alone for those).
func (o outcome) forLimiter() (success, ok bool) {
	switch {
	case o.kind == outcomeNothing, o.kind == outcomeQuota && !o.retried:
		return false, false
	case o.kind == outcomeSuccess:
		return true, true
	}
	return !(o.kind.failure() || o.retried || o.saysDontRetry()), true
}

// forBreaker is what the circuit breaker hears. A busy target is alive:
// ignored. Any "do not retry" answer to a half-open probe is ignored too:
// the target answers, and counting the failure of its dependency would
// reopen this breaker with a doubled interval each time, so that after an
// outage the breakers of a chain, each waiting for the one below, recover
// one after the other. In the closed state it counts, so that the tier
// above stops sending while the chain below it is broken.
func (k outcomeKind) forBreaker(probe bool) breaker.Outcome {
	switch {
	case probe && (k == outcomeDontRetry || k == outcomeDontRetryAnswer):
		return breaker.Ignored
	case k == outcomeSuccess || k == outcomeAnswer || k == outcomeDontRetryAnswer:
		return breaker.Success
	case k == outcomeOverload || k == outcomeTimeout || k == outcomeHang || k == outcomeDontRetry:
		return breaker.Failure
	}
	return breaker.Ignored
}

// forThrottle is what the adaptive throttle hears (see WithAdaptive). A
// "do not retry" answer is neither overload nor health (adaptive.Ignored);
// the throttle guard revives a down target on one that answered a probe
// (see revives).
func (k outcomeKind) forThrottle() adaptive.Outcome {
	switch k {
	case outcomeSuccess, outcomeAnswer:
		return adaptive.Accept
	case outcomeOverload, outcomeTimeout:
		return adaptive.Overload
	case outcomeHang:
		// An overload only if the target answered nothing while the
		// attempt waited (see adaptive.Silence).
		return adaptive.Silence
	case outcomeBusy:
		return adaptive.Busy
	}
	return adaptive.Ignored
}

// revives reports whether the outcome, answering a probe of a down target,
// revives it: a "do not retry" answer shows a live target.
func (k outcomeKind) revives() bool {
	return k == outcomeDontRetry || k == outcomeDontRetryAnswer
}

// mayRetry reports whether the attempt's code is retried: a configured
// code, or DEADLINE_EXCEEDED of the attempt's own timeout.
func (o outcome) mayRetry() bool { return o.retried }

// saysDontRetry reports whether the answer carried "do not retry".
func (o outcome) saysDontRetry() bool { return o.hasPushback && o.pushback < 0 }
