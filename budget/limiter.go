package budget

// Limiter decides whether a retry may be sent. [Budget] and [Throttle]
// implement it; implementations are safe for concurrent use and never block.
//
// A caller records every first attempt with RecordRequest, reports the
// outcome of every attempt, first or retry, with RecordOutcome, and then,
// if it wants to retry, asks TryRetry (a true answer has already recorded
// the retry). The order matters for Throttle: the failure must be reported
// before the question, as grpc-go takes the token and decides in one step.
type Limiter interface {
	// RecordRequest records a first attempt (not a retry). Budget counts it; Throttle ignores it.
	RecordRequest()
	// TryRetry reports whether one retry may be sent now, and if so records it.
	TryRetry() bool
	// RecordOutcome records the result of any attempt: success=false for a failure that counts
	// against the target (the caller decides which codes). Throttle uses it; Budget ignores it.
	RecordOutcome(success bool)
	// Snapshot returns counters for metrics without stopping callers.
	Snapshot() Snapshot
}

var (
	_ Limiter = (*Budget)(nil)
	_ Limiter = (*Throttle)(nil)
)

// Snapshot holds a Limiter's counters for metrics. The fields are read one
// by one without stopping callers, so under concurrent use they may be a
// few operations apart from each other.
type Snapshot struct {
	// Requests is the number of first attempts in the current window
	// (Budget only; zero for Throttle, which has no window).
	Requests int64
	// Retries is the number of retries granted in the current window
	// (Budget only; zero for Throttle).
	Retries int64
	// Granted is the total number of TryRetry calls that returned true
	// since the Limiter was created.
	Granted int64
	// Refused is the total number of TryRetry calls that returned false
	// since the Limiter was created.
	Refused int64
	// Ratio is Retries / Requests in the current window, or zero when
	// Requests is zero (Budget only; zero for Throttle).
	Ratio float64
	// Tokens is the current token count (Throttle only; zero for Budget).
	Tokens float64
	// MaxTokens is the configured capacity (Throttle only; zero for Budget).
	MaxTokens float64
}
