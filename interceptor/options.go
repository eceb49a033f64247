package interceptor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/hedge"
)

// DefaultMaxAttempts is the number of attempts, first call included, that
// a client makes when no option or tier policy says otherwise.
const DefaultMaxAttempts = 3

// MaxAttempts is the most attempts per call that WithMaxAttempts and a
// TierPolicyConfig accept.
const MaxAttempts = 100

// ErrInvalidOption is wrapped by the error New returns for an invalid
// option; the message names the option.
var ErrInvalidOption = errors.New("stormguard: invalid option")

// Option configures the interceptors. One type serves the client and the
// server interceptors; each option says which side reads it. An Option is
// also a grpc.CallOption, so the options documented as "usable per call"
// (WithMaxAttempts, WithCodes, WithBackoff, WithPerAttemptTimeout,
// WithTierPolicy, WithTierPolicyConfig, WithReplayBufferSize, WithoutHold,
// and WithHedging without Adaptive) can be given per call, where they
// override the interceptor's for that call:
//
//	client.Pay(ctx, req, interceptor.WithMaxAttempts(1))
//
// A per-call option that is invalid, or that is not usable per call (such
// as WithBudget, WithBreaker or WithObserver, whose state lives in the
// interceptor), fails the call with codes.Internal and a message naming
// the option: it is a mistake in the calling code, not in the request, so
// it must not reach the caller's caller as INVALID_ARGUMENT.
type Option struct {
	grpc.EmptyCallOption
	apply func(*config) error
	// setup names an option that only New accepts, not a call.
	setup string
}

// setupOption returns an Option named name that New accepts and a call
// refuses.
func setupOption(name string, apply func(*config) error) Option {
	return Option{apply: apply, setup: name}
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
	throttles         *adaptive.Set
	perMethod         bool
	methodKeys        *methodKeys // with perMethod: the keys made (see methodKeys)
	untrusted         bool
	ignoreEnvoy       bool // see WithEnvoyAttemptCount
	replayLimit       int
	observer          Observer
	admission         *admission.Limiter
	health            *selfHealth
	noHold            bool         // WithoutHold
	hedging           *hedging     // WithHedging; nil: no hedges
	hedgeAdaptive     hedge.Config // WithHedging at New: of delays
	delays            *delaySet    // the adaptive hedge delays, made by New
	// mechanisms make the per-target mechanisms of a call, in the order
	// they are asked (see buildMechanisms).
	mechanisms []mechanismFor

	// limiterBy names the retry limiter option that set limiters, to
	// refuse a second one.
	limiterBy string
	// deadlineCode: WithCodes listed codes.DeadlineExceeded, which needs
	// a per-attempt timeout (see check).
	deadlineCode bool

	// Test hooks: the random source for jitter, the wait between
	// attempts, and the time an attempt ended (compared with its deadline).
	rand  func() float64
	sleep func(ctx context.Context, d time.Duration) error
	hold  func(ctx context.Context, d time.Duration, back <-chan struct{}) error
	now   func() time.Time
	// afterFunc calls f on a goroutine of its own after d, unless
	// stopped first: the wait before a hedge. Nil: the real clock's
	// (time.AfterFunc, and a lead's first hedge from a pool).
	afterFunc func(d time.Duration, f func()) stopper
}

func defaultConfig() config {
	return config{
		maxAttempts: DefaultMaxAttempts,
		retryable:   codeBit(codes.Unavailable),
		policy:      DefaultTierPolicy,
		replayLimit: DefaultReplayBufferSize,
		rand:        rand.Float64,
		sleep:       sleepCtx,
		hold:        holdCtx,
		now:         time.Now,
	}
}

// stopper stops a wait started by config.afterFunc.
type stopper interface{ Stop() bool }

// after calls f on a goroutine of its own after d, unless stopped first.
func (c *config) after(d time.Duration, f func()) stopper {
	if c.afterFunc == nil {
		return time.AfterFunc(d, f)
	}
	return c.afterFunc(d, f)
}

func codeBit(c codes.Code) uint64 {
	if c > 63 {
		return 0
	}
	return 1 << uint(c)
}

// retries reports whether code is one of the configured retryable codes.
// DeadlineExceeded never is: the client decides it per attempt (see
// classifyKind in outcome.go: only the attempt's own timeout is retried).
func (c *config) retries(code codes.Code) bool { return c.retryable&codeBit(code) != 0 }

// newConfig applies opts to the defaults.
func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	if err := cfg.applyAll(opts); err != nil {
		return cfg, err
	}
	cfg.delays = newDelaySet(cfg.hedgeAdaptive)
	if cfg.perMethod {
		cfg.methodKeys = new(methodKeys)
	}
	cfg.buildMechanisms()
	return cfg, cfg.check()
}

// check reports the mistakes that no single option shows.
func (c *config) check() error {
	if c.deadlineCode && c.perAttemptTimeout == 0 {
		return invalid("WithCodes(codes.DeadlineExceeded) without WithPerAttemptTimeout: " +
			"DeadlineExceeded is retried exactly when an attempt's own timeout expired, never for the caller's deadline; " +
			"add WithPerAttemptTimeout(d), or drop codes.DeadlineExceeded from WithCodes")
	}
	return nil
}

// forCall returns the configuration for one call: c itself, or a copy
// with the call's own Options applied. Its error is a status error with
// codes.Internal (see Option).
func (c *config) forCall(opts []grpc.CallOption) (*config, error) {
	cfg := c
	copied := false
	for _, o := range opts {
		so, ok := o.(Option)
		if !ok || so.apply == nil {
			continue
		}
		if so.setup != "" {
			return nil, status.Error(codes.Internal, invalid("%s is not usable per call: give it to New (or the interceptor constructor)", so.setup).Error())
		}
		if !copied {
			cp := *c
			cfg, copied = &cp, true
		}
		if err := so.apply(cfg); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	if copied {
		if err := cfg.check(); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return cfg, nil
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
// Valid: 1 to MaxAttempts (100). Default DefaultMaxAttempts (3). Client
// side; usable per call. The tier policy may lower it for a given request.
func WithMaxAttempts(n int) Option {
	return Option{apply: func(c *config) error {
		if n < 1 || n > MaxAttempts {
			return invalid("WithMaxAttempts(%d): want 1 to %d", n, MaxAttempts)
		}
		c.maxAttempts = n
		return nil
	}}
}

// WithCodes sets the codes that are retried. Default: codes.Unavailable
// only. At least one code is needed (to turn retries off, write
// WithMaxAttempts(1)); codes.OK and codes.Canceled (the caller, or a proxy
// for it, gave up) are refused.
//
// DeadlineExceeded is retried exactly when the attempt's own timeout
// (WithPerAttemptTimeout) expired and the caller's context is still alive,
// whether it is listed or not; the caller's deadline is never retried. So
// listing it is accepted together with WithPerAttemptTimeout, where it
// says what happens anyway, and refused without it, where it would do
// nothing.
//
// Client and server side: a server answers "do not retry" only with these
// codes. Usable per call.
func WithCodes(cs ...codes.Code) Option {
	return Option{apply: func(c *config) error {
		if len(cs) == 0 {
			return invalid("WithCodes() with no codes: to turn retries off, write WithMaxAttempts(1)")
		}
		var set uint64
		deadline := false
		for _, code := range cs {
			switch {
			case code == codes.OK:
				return invalid("WithCodes: codes.OK is not an error")
			case code == codes.Canceled:
				return invalid("WithCodes: codes.Canceled cannot be retried: it means the caller gave up")
			case code > codes.Unauthenticated:
				return invalid("WithCodes: unknown code %d", uint32(code))
			case code == codes.DeadlineExceeded:
				deadline = true // see check; never in the set
			default:
				set |= codeBit(code)
			}
		}
		c.retryable, c.deadlineCode = set, deadline
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
// deadline. Only with it is DeadlineExceeded retried: when the attempt's
// timeout, not the caller's, expired, that is when the answer arrives
// after the attempt's deadline and that deadline is earlier than the
// caller's, whether the client's timer or the server's (sent in
// grpc-timeout) fired first. Zero, the default, means no per-attempt
// timeout. Client side; usable per call.
//
// Size it above the target's usual latency for the method (its p99):
// an attempt that runs into it is a failure to every mechanism, to the
// adaptive throttle an overload as UNAVAILABLE is, so that a dependency
// slowed down behind a queue is shed and not retried into. A timeout
// that the method's normal answers outlast makes a healthy target look
// overloaded: a user's trial gave a 300-800 ms report WithPerAttemptTimeout
// (700 ms) next to 1 ms lookups on the same target, and with 64 callers
// mostly waiting on reports, the throttle called the target down three
// times in 6 s (the lookups were held or refused meanwhile).
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
	return withLimiters("WithBudget", func() (budget.Limiter, error) { return budget.New(cfg) })
}

// WithThrottle limits retries with a gRFC A6 token bucket per target (see
// budget.Throttle) instead of a budget. As in grpc-go, an attempt that
// fails with a code the client retries (WithCodes), or that answers "do
// not retry", takes a token, and an OK gives TokenRatio back; unlike
// grpc-go, so does an answer with another code (docs/protocol.md 4.3).
// Client side.
func WithThrottle(cfg budget.ThrottleConfig) Option {
	return withLimiters("WithThrottle", func() (budget.Limiter, error) { return budget.NewThrottle(cfg) })
}

// WithLimiter limits retries with limiters made by newLimiter, one per
// target, for a budget.Limiter of your own. Client side.
func WithLimiter(newLimiter func() budget.Limiter) Option {
	if newLimiter == nil {
		return setupOption("WithLimiter", func(*config) error { return invalid("WithLimiter(nil)") })
	}
	return withLimiters("WithLimiter", func() (budget.Limiter, error) { return newLimiter(), nil })
}

func withLimiters(name string, newLimiter func() (budget.Limiter, error)) Option {
	// Build one now, so that an invalid configuration is reported by New
	// rather than on the first call.
	l, err := newLimiter()
	switch {
	case err != nil:
	case l == nil:
		err = errors.New("the limiter constructor returned nil")
	case isNil(l):
		err = fmt.Errorf("the limiter constructor returned a nil %T", l)
	}
	set := newLimiterSet(newLimiter, maxLimiterKeys)
	return setupOption(name, func(c *config) error {
		if err != nil {
			return invalid("%s: %v", name, err)
		}
		if c.limiterBy != "" && c.limiterBy != name {
			return invalid("%s and %s: one retry limiter per interceptor; keep one of them (to replace Recommended()'s budget with another limiter, write its options out)", c.limiterBy, name)
		}
		c.limiters, c.limiterBy = set, name
		return nil
	})
}

// WithBreaker puts every attempt behind a circuit breaker per target from
// set. An open breaker fails the call at once with codes.Unavailable (or,
// when it refuses a retry, with the last attempt's code) and the "do not
// retry" mark. Nil turns breakers off. Client side.
func WithBreaker(set *breaker.Set) Option {
	return setupOption("WithBreaker", func(c *config) error {
		c.breakers = set
		return nil
	})
}

// WithPerMethodKeys keys the per-target state (budgets or throttles,
// breakers, adaptive throttles, hedge delays) by target and method
// instead of by target alone: each method then finds a dead target on
// its own, and takes a key of each set. The key (also Event.Target) is the target, a space
// and the method, "dns:///payment:443 /pay.v1.Pay/Charge", or both quoted
// with strconv.Quote when either holds a space or the target starts with
// a double quote, so two different pairs never share a key. As for
// breakers (breaker.Set), at most 1024 retry limiters are kept; a new key
// past that replaces one not used recently. Client side.
func WithPerMethodKeys() Option {
	return setupOption("WithPerMethodKeys", func(c *config) error {
		c.perMethod = true
		return nil
	})
}

// WithUntrustedCallers makes the server interceptor ignore the attempt
// metadata of incoming requests: the tier behaves as the edge (depth 0, no
// upstream retries), its own outgoing calls start the depth count at 1,
// and a caller cannot forge headers to switch its retries off, to make the
// tiers below retry more, or to probe its policy. Use it on the tier that
// faces clients you do not control, and only there: a tier behind the edge
// that used it would restart the depth count at 0 and so defeat a depth
// policy (WithTierPolicyConfig), and would not see that a tier above is
// already retrying. Server side.
func WithUntrustedCallers() Option {
	return setupOption("WithUntrustedCallers", func(c *config) error {
		c.untrusted = true
		return nil
	})
}
