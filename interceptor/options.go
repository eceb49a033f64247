package interceptor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// DefaultMaxAttempts is the number of attempts, first call included, that
// a client makes when no option or tier policy says otherwise.
const DefaultMaxAttempts = 3

// ErrInvalidOption is wrapped by the error New returns for an invalid
// option; the message names the option.
var ErrInvalidOption = errors.New("stormguard: invalid option")

// Option configures the interceptors. One type serves the client and the
// server interceptors; each option says which side reads it. An Option is
// also a grpc.CallOption, so the client options can be given per call, where
// they override the interceptor's for that call:
//
//	client.Pay(ctx, req, interceptor.WithMaxAttempts(1))
type Option struct {
	grpc.EmptyCallOption
	apply func(*config) error
}

// config is the resolved set of options.
type config struct {
	maxAttempts       int
	retryable         uint64 // bit set of codes.Code
	backoff           Backoff
	perAttemptTimeout time.Duration
	policy            TierPolicy
	limiters          *limiterSet
	breakers          *breaker.Set
	perMethod         bool
	untrusted         bool
	replayLimit       int
	observer          Observer
	admission         *admission.Limiter

	// Test hooks: the random source for jitter, and the wait between
	// attempts.
	rand  func() float64
	sleep func(ctx context.Context, d time.Duration) error
}

func defaultConfig() config {
	return config{
		maxAttempts: DefaultMaxAttempts,
		retryable:   codeBit(codes.Unavailable),
		policy:      DefaultTierPolicy,
		replayLimit: DefaultReplayBufferSize,
		rand:        rand.Float64,
		sleep:       sleepCtx,
	}
}

func codeBit(c codes.Code) uint64 {
	if c > 63 {
		return 0
	}
	return 1 << uint(c)
}

// retries reports whether code is one of the configured retryable codes.
// DeadlineExceeded never is: the client decides it per attempt (see
// call.retryable).
func (c *config) retries(code codes.Code) bool { return c.retryable&codeBit(code) != 0 }

// newConfig applies opts to the defaults.
func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	return cfg, cfg.applyAll(opts)
}

func (c *config) applyAll(opts []Option) error {
	for _, o := range opts {
		if o.apply == nil {
			continue
		}
		if err := o.apply(c); err != nil {
			return err
		}
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// WithMaxAttempts sets the number of attempts per call, first call
// included: 3 means one call and at most two retries; 1 turns retries off.
// Default DefaultMaxAttempts (3). Client side; usable per call. The tier
// policy may lower it for a given request.
func WithMaxAttempts(n int) Option {
	return Option{apply: func(c *config) error {
		if n < 1 || n > MaxAttemptIndex+1 {
			return invalid("WithMaxAttempts(%d): want 1 to %d", n, MaxAttemptIndex+1)
		}
		c.maxAttempts = n
		return nil
	}}
}

// WithCodes sets the codes that are retried. Default: codes.Unavailable
// only. DeadlineExceeded is never in the set: it is retried exactly when
// the attempt's own timeout (WithPerAttemptTimeout) expired and the
// caller's context is still alive. Client and server side: a server
// answers "do not retry" only with these codes. Usable per call.
func WithCodes(cs ...codes.Code) Option {
	return Option{apply: func(c *config) error {
		var set uint64
		for _, code := range cs {
			if code == codes.OK || code == codes.DeadlineExceeded || code > 16 {
				return invalid("WithCodes: %v cannot be retried", code)
			}
			set |= codeBit(code)
		}
		c.retryable = set
		return nil
	}}
}

// WithBackoff sets the delay between attempts. Default: full jitter, base
// 50 ms, cap 1 s. Client side; usable per call.
func WithBackoff(b Backoff) Option {
	return Option{apply: func(c *config) error {
		switch {
		case b.Base < 0:
			return invalid("WithBackoff: negative Base %v", b.Base)
		case b.Cap < 0:
			return invalid("WithBackoff: negative Cap %v", b.Cap)
		case b.Jitter < FullJitter || b.Jitter > DecorrelatedJitter:
			return invalid("WithBackoff: unknown Jitter %d", int(b.Jitter))
		}
		if b = b.withDefaults(); b.Cap < b.Base {
			return invalid("WithBackoff: Cap %v below Base %v", b.Cap, b.Base)
		}
		c.backoff = b
		return nil
	}}
}

// WithPerAttemptTimeout bounds each attempt by d, within the caller's
// deadline. Only with it is DeadlineExceeded retried (when the attempt's
// timeout, not the caller's, expired). Zero, the default, means no
// per-attempt timeout. Client side; usable per call.
func WithPerAttemptTimeout(d time.Duration) Option {
	return Option{apply: func(c *config) error {
		if d < 0 {
			return invalid("WithPerAttemptTimeout: negative %v", d)
		}
		c.perAttemptTimeout = d
		return nil
	}}
}

// WithBudget limits retries with a retry budget per target (see
// budget.Budget): every first attempt is recorded, and every retry must be
// granted. An invalid cfg makes New fail. The budgets live in the option:
// pass the same Option value to the unary and stream interceptors to share
// them. Client side.
func WithBudget(cfg budget.Config) Option {
	return withLimiters(func() (budget.Limiter, error) { return budget.New(cfg) })
}

// WithThrottle limits retries with a gRFC A6 token bucket per target (see
// budget.Throttle) instead of a budget. Client side.
func WithThrottle(cfg budget.ThrottleConfig) Option {
	return withLimiters(func() (budget.Limiter, error) { return budget.NewThrottle(cfg) })
}

// WithLimiter limits retries with limiters made by newLimiter, one per
// target, for a budget.Limiter of your own. Client side.
func WithLimiter(newLimiter func() budget.Limiter) Option {
	if newLimiter == nil {
		return Option{apply: func(*config) error { return invalid("WithLimiter(nil)") }}
	}
	return withLimiters(func() (budget.Limiter, error) { return newLimiter(), nil })
}

func withLimiters(newLimiter func() (budget.Limiter, error)) Option {
	// Build one now, so that an invalid configuration is reported by New
	// rather than on the first call.
	l, err := newLimiter()
	if err == nil && l == nil {
		err = errors.New("the limiter constructor returned nil")
	}
	set := &limiterSet{newLimiter: newLimiter}
	return Option{apply: func(c *config) error {
		if err != nil {
			return invalid("retry limiter: %v", err)
		}
		c.limiters = set
		return nil
	}}
}

// WithBreaker puts every attempt behind a circuit breaker per target from
// set. An open breaker fails the call at once with codes.Unavailable (or,
// when it refuses a retry, with the last attempt's code) and the "do not
// retry" mark. Nil turns breakers off. Client side.
func WithBreaker(set *breaker.Set) Option {
	return Option{apply: func(c *config) error {
		c.breakers = set
		return nil
	}}
}

// WithPerMethodKeys keys budgets and breakers by target and method instead
// of by target alone. Client side.
func WithPerMethodKeys() Option {
	return Option{apply: func(c *config) error {
		c.perMethod = true
		return nil
	}}
}

// WithUntrustedCallers makes the server interceptor ignore the attempt
// metadata of incoming requests: the tier behaves as the edge (depth 0,
// no upstream retries), and a caller cannot forge headers to switch its
// retries off or to probe its policy. Use it on the tier that faces
// clients you do not control. Server side.
func WithUntrustedCallers() Option {
	return Option{apply: func(c *config) error {
		c.untrusted = true
		return nil
	}}
}

// limiterSet holds one limiter per key, created on first use.
type limiterSet struct {
	newLimiter func() (budget.Limiter, error)
	m          sync.Map // string -> budget.Limiter
}

func (s *limiterSet) get(key string) budget.Limiter {
	if l, ok := s.m.Load(key); ok {
		return l.(budget.Limiter)
	}
	l, err := s.newLimiter()
	if err != nil || l == nil {
		// The constructor succeeded in withLimiters with the same input,
		// so this is a custom limiter's bug: run without a limiter rather
		// than fail calls.
		return nil
	}
	actual, _ := s.m.LoadOrStore(key, l)
	return actual.(budget.Limiter)
}

// Range calls f for each key and limiter, for metrics.
func (s *limiterSet) Range(f func(key string, l budget.Limiter) bool) {
	s.m.Range(func(k, v any) bool { return f(k.(string), v.(budget.Limiter)) })
}
