package budget

import (
	"fmt"
	"math"
	"sync/atomic"
)

// Defaults for the zero fields of [ThrottleConfig]: the example of gRFC A6,
// which stops retries once failures outnumber successes about ten to one.
const (
	DefaultMaxTokens  = 10.0
	DefaultTokenRatio = 0.1
)

// ThrottleConfig configures a [Throttle] like the retryThrottling block of a
// gRPC service config. The zero value of every field means its default.
type ThrottleConfig struct {
	// MaxTokens is the capacity of the bucket and the initial token count.
	// Zero means DefaultMaxTokens (10). Valid: 0 < MaxTokens <= 1000, the
	// range grpc-go accepts, with a precision of 0.001.
	MaxTokens float64

	// TokenRatio is the number of tokens a success adds. Zero means
	// DefaultTokenRatio (0.1). Valid: 0.001 <= TokenRatio <= 1000; it is
	// rounded to 3 decimal places, the precision gRFC A6 supports.
	TokenRatio float64
}

// Throttle is the retry throttle of gRFC A6, as grpc-go applies it when a
// service config sets retryThrottling. It holds a token count that starts at
// MaxTokens and stays within [0, MaxTokens]: every failed attempt (reported
// with RecordOutcome(false)) takes one token, every success adds TokenRatio.
// TryRetry grants a retry while the count is above MaxTokens/2 and takes no
// token itself. So with the defaults (10, 0.1) retries stop after 5
// failures in a row from a full bucket, and one success brings them back.
//
// Tokens are kept as integer thousandths in one atomic word, updated with
// compare-and-swap: no lock, no allocation, exact arithmetic. Throttle has
// no window and no clock, and it ignores RecordRequest.
//
// A Throttle must be created with NewThrottle; the zero Throttle is not
// usable.
type Throttle struct {
	tokens atomic.Int64 // milli-tokens
	_      [56]byte

	granted atomic.Int64
	refused atomic.Int64
	_       [48]byte

	max   int64 // milli-tokens
	ratio int64 // milli-tokens per success
	cfg   ThrottleConfig
}

// NewThrottle returns a Throttle for cfg, or an error wrapping
// ErrInvalidConfig that names the offending field.
func NewThrottle(cfg ThrottleConfig) (*Throttle, error) {
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	t := &Throttle{
		max:   int64(math.Round(cfg.MaxTokens * 1000)),
		ratio: int64(math.Round(cfg.TokenRatio * 1000)),
		cfg:   cfg,
	}
	t.tokens.Store(t.max)
	return t, nil
}

// resolve validates c and fills in defaults.
func (c *ThrottleConfig) resolve() error {
	switch {
	case math.IsNaN(c.MaxTokens) || c.MaxTokens < 0 || c.MaxTokens > 1000 ||
		(c.MaxTokens != 0 && math.Round(c.MaxTokens*1000) < 1):
		return fmt.Errorf("%w: MaxTokens %v out of range (0, 1000]", ErrInvalidConfig, c.MaxTokens)
	case math.IsNaN(c.TokenRatio) || c.TokenRatio < 0 || c.TokenRatio > 1000 ||
		(c.TokenRatio != 0 && math.Round(c.TokenRatio*1000) < 1):
		return fmt.Errorf("%w: TokenRatio %v out of range [0.001, 1000]", ErrInvalidConfig, c.TokenRatio)
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = DefaultMaxTokens
	}
	if c.TokenRatio == 0 {
		c.TokenRatio = DefaultTokenRatio
	}
	return nil
}

// Config returns the configuration in use, with defaults filled in.
func (t *Throttle) Config() ThrottleConfig { return t.cfg }

// RecordRequest does nothing: a Throttle counts outcomes, not requests. It
// is there to satisfy Limiter.
func (t *Throttle) RecordRequest() {}

// TryRetry reports whether the token count is above MaxTokens/2. It takes
// no token: the failure that led to the retry already took one.
func (t *Throttle) TryRetry() bool {
	if 2*t.tokens.Load() > t.max {
		t.granted.Add(1)
		return true
	}
	t.refused.Add(1)
	return false
}

// RecordOutcome takes one token for a failure and adds TokenRatio for a
// success, keeping the count within [0, MaxTokens].
func (t *Throttle) RecordOutcome(success bool) {
	for {
		old := t.tokens.Load()
		var next int64
		if success {
			next = min(old+t.ratio, t.max)
		} else {
			next = max(old-1000, 0)
		}
		if next == old || t.tokens.CompareAndSwap(old, next) {
			return
		}
	}
}

// Snapshot returns the token count and the totals of granted and refused
// retries. Requests, Retries and Ratio are zero: a Throttle has no window.
func (t *Throttle) Snapshot() Snapshot {
	return Snapshot{
		Granted:   t.granted.Load(),
		Refused:   t.refused.Load(),
		Tokens:    float64(t.tokens.Load()) / 1000,
		MaxTokens: float64(t.max) / 1000,
	}
}
