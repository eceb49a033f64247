package interceptor

import (
	"fmt"

	spb "google.golang.org/genproto/googleapis/rpc/status"
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
	// StopCommitted: a stream failed after it committed (a response had
	// arrived), when it can no longer be retried.
	StopCommitted
	// StopThrottled: the adaptive throttle refused the attempt (shed,
	// target down, or a retry into a target that is not healthy).
	StopThrottled
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
	StopCommitted:    "stream already committed",
	StopThrottled:    "adaptive throttle refused",
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

// Error is the error of a call that stormguard retried or stopped. It keeps
// the code, message and details of the last attempt (codes.Unavailable when
// an open breaker refused the first attempt), says how many attempts were
// made and why retrying stopped, and unwraps to the last attempt's error
// and, when they caused the stop, to breaker.ErrOpen or budget.ErrRefused.
type Error struct {
	// Attempts is the number of attempts that reached the network.
	Attempts int
	// Reason is why retrying stopped.
	Reason StopReason

	st    *status.Status
	last  error // the last attempt's error; nil if no attempt was made
	cause error // breaker.ErrOpen, budget.ErrRefused, or nil
}

func newError(last error, attempts int, reason StopReason, target string) *Error {
	e := &Error{Attempts: attempts, Reason: reason, last: last}
	switch reason {
	case StopBreakerOpen:
		e.cause = breaker.ErrOpen
	case StopBudget:
		e.cause = budget.ErrRefused
	case StopThrottled:
		e.cause = adaptive.ErrThrottled
	}
	p := &spb.Status{Code: int32(codes.Unavailable)}
	if last != nil {
		p = status.Convert(last).Proto() // a copy
	}
	suffix := fmt.Sprintf("stormguard: %d attempt(s), stopped: %s", attempts, reason)
	if reason == StopBreakerOpen {
		suffix = fmt.Sprintf("stormguard: circuit breaker for %s is open; %d attempt(s)", target, attempts)
	}
	if p.Message == "" {
		p.Message = suffix
	} else {
		p.Message += " (" + suffix + ")"
	}
	e.st = status.FromProto(p)
	return e
}

func (e *Error) Error() string {
	return fmt.Sprintf("rpc error: code = %s desc = %s", e.st.Code(), e.st.Message())
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
