package interceptor

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// StopReason says why a client stopped retrying a call.
type StopReason int

// The reasons a client stops retrying.
const (
	// StopNotRetryable: the last attempt ended with a code that is not
	// retried.
	StopNotRetryable StopReason = iota + 1
	// StopAttempts: every allowed attempt was made.
	StopAttempts
	// StopBudget: the retry budget (or throttle) refused the retry.
	StopBudget
	// StopBreakerOpen: the circuit breaker for the target is open.
	StopBreakerOpen
	// StopTierPolicy: the tier policy allowed fewer attempts than
	// configured (by default because a tier above is already retrying).
	StopTierPolicy
	// StopPushback: the server answered "do not retry" (a negative
	// grpc-retry-pushback-ms).
	StopPushback
	// StopDeadline: the caller's deadline ends before the next retry
	// could start.
	StopDeadline
	// StopCanceled: the caller's context is done.
	StopCanceled
	// StopCommitted: the call failed after it committed (gRFC A6:
	// response headers or a message had arrived, or a stream outgrew its
	// replay buffer or its Context was taken), when it can no longer be
	// retried.
	StopCommitted
	// StopThrottled: the adaptive throttle refused the attempt (shed,
	// target down, or a retry into a target that is not healthy).
	StopThrottled
	// StopHedgesLost: a hedge was not sent because too few of the
	// target's recent hedges answered first (see WithHedging): another
	// attempt only added load (EventHedgeRefused only).
	StopHedgesLost
	// StopQueueing: a hedge was not sent because the target's recent
	// median latency is more than twice its lowest lately: it is queueing
	// (at capacity, or overloaded), and a hedge would only add to the
	// queue (see WithHedging; EventHedgeRefused only).
	StopQueueing
	// StopHedgeShare: a hedge was not sent because the target's recent
	// hedges came to their share of its recent calls (1 - the adaptive
	// delay's Percentile, 5 % by default; see WithHedging;
	// EventHedgeRefused only).
	StopHedgeShare
)

var stopReasonNames = map[StopReason]string{
	StopNotRetryable: "code not retryable",
	StopAttempts:     "attempts used up",
	StopBudget:       "retry budget exhausted",
	StopBreakerOpen:  "circuit breaker open",
	StopTierPolicy:   "tier policy allows fewer attempts",
	StopPushback:     "server said do not retry",
	StopDeadline:     "deadline too close to retry",
	StopCanceled:     "caller's context done",
	StopCommitted:    "call already committed",
	StopThrottled:    "adaptive throttle refused",
	StopHedgesLost:   "recent hedges rarely won",
	StopQueueing:     "target is queueing",
	StopHedgeShare:   "hedges at their share of calls",
}

func (r StopReason) String() string {
	if s, ok := stopReasonNames[r]; ok {
		return s
	}
	return fmt.Sprintf("StopReason(%d)", int(r))
}

// marksUpstream reports whether stopping for r tells the tier above not to
// retry: the failure was retryable, and this tier already did (or was not
// allowed to do) all the retrying that should happen.
func (r StopReason) marksUpstream() bool {
	return r != StopNotRetryable && r != StopCanceled
}

// ErrBudgetExhausted is matched by errors.Is on the error of a call whose
// retry the budget or throttle refused. It is budget.ErrRefused.
var ErrBudgetExhausted = budget.ErrRefused

// Error is the error of a call that stormguard retried or stopped.
//
// Its status (GRPCStatus, what status.Code and status.FromError see, and
// what a server that returns the error sends on the wire) is the last
// attempt's, unchanged: code, message and details as the downstream sent
// them. So a message does not grow by a suffix at every tier of a chain.
// The exception: when the caller's context ended while the call waited
// for a retry, the status is that of the context's error (Canceled or
// DeadlineExceeded), which is why the call ended.
// When no attempt was made (an open breaker or the adaptive throttle
// refused the first one), the status is codes.Unavailable with the fixed
// message BreakerOpenMessage or ThrottledMessage, which name no target.
// (An attempt's own message is the downstream's, or grpc-go's when the
// connection failed, which names the address it dialed: see SECURITY.md.)
//
// Its Go error string (Error) adds stormguard's account, for logs: the
// number of attempts and why retrying stopped; the target is in the
// observer's events (Event.Target), not here. Attempts and Reason hold the
// same. Errors unwraps to the last attempt's error and, when they caused
// the stop, to breaker.ErrOpen, budget.ErrRefused, adaptive.ErrThrottled,
// or the caller's context error (context.Canceled or
// context.DeadlineExceeded, when the caller left during a wait).
//
// A handler that passes the error up should return it as it is (or
// status.Convert(err).Err()): grpc-go sends the status of an error that
// has a GRPCStatus method, but for an error that only wraps one (such as
// fmt.Errorf("charge: %w", err)) it sends the wrapper's Error() string as
// the message, stormguard's account included.
type Error struct {
	// Attempts is the number of attempts made (started: an attempt that
	// failed on the channel before reaching the network counts).
	Attempts int
	// Reason is why retrying stopped.
	Reason StopReason

	st    *status.Status
	last  error // the last attempt's error; nil if no attempt was made
	cause error // breaker.ErrOpen, budget.ErrRefused, adaptive.ErrThrottled, the context's error, or nil
}

// BreakerOpenMessage is the status message of a call that an open circuit
// breaker refused before any attempt.
const BreakerOpenMessage = "stormguard: circuit breaker open"

// ThrottledMessage is the status message of a call that the adaptive
// throttle (WithAdaptive) refused before any attempt.
const ThrottledMessage = "stormguard: target overloaded or down, request not sent"

// newError returns the error of a call that stopped for reason after
// attempts attempts, the last of which ended with last. The target is not
// put into the error (see Error).
func newError(last error, attempts int, reason StopReason) *Error {
	e := &Error{Attempts: attempts, Reason: reason, last: last}
	switch reason {
	case StopBreakerOpen:
		e.cause = breaker.ErrOpen
	case StopBudget:
		e.cause = budget.ErrRefused
	case StopThrottled:
		e.cause = adaptive.ErrThrottled
	}
	if last != nil {
		e.st = status.Convert(last)
	} else if reason == StopThrottled {
		e.st = status.New(codes.Unavailable, ThrottledMessage)
	} else {
		e.st = status.New(codes.Unavailable, BreakerOpenMessage)
	}
	return e
}

// Error returns the status in grpc-go's form, followed by stormguard's
// account: "rpc error: code = Unavailable desc = payment is down
// (stormguard: 3 attempt(s), stopped: attempts used up)".
func (e *Error) Error() string {
	return fmt.Sprintf("rpc error: code = %s desc = %s (stormguard: %d attempt(s), stopped: %s)", e.st.Code(), e.st.Message(), e.Attempts, e.Reason)
}

// GRPCStatus returns the status the call ends with, so that status.Code
// and status.FromError see the last attempt's code.
func (e *Error) GRPCStatus() *status.Status { return e.st }

// Unwrap returns the last attempt's error and the cause of the stop.
func (e *Error) Unwrap() []error {
	errs := make([]error, 0, 2)
	if e.last != nil {
		errs = append(errs, e.last)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}
