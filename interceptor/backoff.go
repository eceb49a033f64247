package interceptor

import (
	"math"
	"time"
)

// Jitter chooses how a retry delay is drawn from its exponential ceiling.
type Jitter int

const (
	// FullJitter draws the delay uniformly from [0, ceiling): the default,
	// and the one that spreads a crowd of clients best.
	FullJitter Jitter = iota
	// EqualJitter waits half the ceiling plus a uniform draw from the
	// other half: never shorter than ceiling/2.
	EqualJitter
	// DecorrelatedJitter grows from the previous delay instead of the
	// attempt number: uniform in [base, 3 x previous), capped.
	DecorrelatedJitter
)

func (j Jitter) String() string {
	switch j {
	case FullJitter:
		return "full"
	case EqualJitter:
		return "equal"
	case DecorrelatedJitter:
		return "decorrelated"
	}
	return "Jitter(?)"
}

// Backoff is the delay schedule between attempts. The zero value means
// the defaults: base 50 ms, cap 1 s, full jitter.
type Backoff struct {
	// Base is the ceiling of the first retry's delay. Zero means 50 ms.
	Base time.Duration
	// Cap bounds every delay, including a server's pushback. Zero means 1 s.
	Cap time.Duration
	// Jitter is the jitter strategy. The zero value is FullJitter.
	Jitter Jitter
}

// Default backoff values.
const (
	DefaultBackoffBase = 50 * time.Millisecond
	DefaultBackoffCap  = time.Second
)

func (b Backoff) withDefaults() Backoff {
	if b.Base == 0 {
		b.Base = DefaultBackoffBase
	}
	if b.Cap == 0 {
		b.Cap = DefaultBackoffCap
	}
	return b
}

// Delay returns the wait before retry number retry (0 for the first retry)
// given u, a uniform random number in [0, 1), and prev, the delay before
// the previous retry (used by DecorrelatedJitter only; 0 for the first).
// It is a pure function: the randomness is the argument, so a test picks
// u and knows the answer. The result is in [0, Cap]. Defaults apply to
// zero fields; u outside [0, 1) is clamped.
func (b Backoff) Delay(retry int, u float64, prev time.Duration) time.Duration {
	b = b.withDefaults()
	if !(u >= 0) { // also catches NaN
		u = 0
	}
	if u >= 1 {
		u = math.Nextafter(1, 0)
	}
	base, ceil := float64(b.Base), float64(b.Cap)
	var d float64
	switch b.Jitter {
	case DecorrelatedJitter:
		hi := 3 * float64(max(prev, b.Base))
		d = base + u*(hi-base)
	case EqualJitter:
		c := exponential(base, ceil, retry)
		d = c/2 + u*c/2
	default:
		d = u * exponential(base, ceil, retry)
	}
	if d >= ceil {
		// Also where Cap is near the largest Duration: float64(Cap)
		// rounds up to 2^63, which no Duration holds.
		return b.Cap
	}
	return time.Duration(d)
}

// exponential returns min(ceil, base * 2^retry) without overflowing.
func exponential(base, ceil float64, retry int) float64 {
	if retry < 0 {
		retry = 0
	}
	if retry > 62 {
		return ceil
	}
	return min(ceil, base*math.Ldexp(1, retry))
}
