package bench

import (
	"fmt"
	"sync/atomic"
	"time"

	fsgo "github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/adaptivethrottler"
	fsbudget "github.com/failsafe-go/failsafe-go/budget"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafegrpc"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/testsvc"
)

// Attempts is the number of attempts per hop, first call included, of
// every retrying stack.
const Attempts = 3

// Stack is one retry stack, installed on every hop and tier of a chain.
type Stack struct {
	// Name is the short name used in tables and benchmark names.
	Name string
	// Desc says how the stack is configured.
	Desc string
	// Streams is false for a stack that has no interceptor for bidi
	// streams; the bidi benchmark skips it.
	Streams bool
	// HasBreaker is true for a stack with a circuit breaker.
	HasBreaker bool
	// build returns the chain configuration of one fresh instance of the
	// stack (fresh budgets, throttles and breakers, one set per hop, as
	// separate processes would have), counting breaker openings in opens.
	build func(opens *Opens) (testsvc.Config, error)
}

// Opens counts breaker openings per hop (0 is the edge client).
type Opens [8]atomic.Int64

func (o *Opens) add(hop int) { o[min(max(hop, 0), len(o)-1)].Add(1) }

// Instance is one fresh instance of a stack.
type Instance struct {
	Config testsvc.Config
	opens  *Opens
}

// BreakerOpens returns how often a breaker of the instance opened, per
// hop: hop 0 is the edge client, hop 1 gateway's client, hop 2 order's.
func (i *Instance) BreakerOpens() [3]int64 {
	return [3]int64{i.opens[0].Load(), i.opens[1].Load(), i.opens[2].Load()}
}

// New returns a fresh instance of s for a chain of the given tiers (nil
// means the default three tiers).
func (s Stack) New(tiers []string, seed uint64) (*Instance, error) {
	opens := new(Opens)
	cfg, err := s.build(opens)
	if err != nil {
		return nil, fmt.Errorf("stack %s: %w", s.Name, err)
	}
	cfg.Tiers, cfg.Seed = tiers, seed
	return &Instance{Config: cfg, opens: opens}, nil
}

// The backoff of every retrying stack is the same as far as each library
// allows: full jitter, uniform in [0, 50 ms) before the first retry and
// [0, 100 ms) before the second (stormguard's default, cap 1 s).
const (
	backoffBase = 50 * time.Millisecond
	backoffCap  = time.Second
)

// serviceConfig is grpc-go's built-in retry policy (maxAttempts 3, full
// jitter 50 ms doubling to 1 s, UNAVAILABLE), with the retry throttle of
// gRFC A6 when throttle is set.
func serviceConfig(throttle bool) string {
	t := ""
	if throttle {
		t = `,"retryThrottling":{"maxTokens":10,"tokenRatio":0.1}`
	}
	return fmt.Sprintf(`{"methodConfig":[{"name":[{"service":"stormguard.testsvc.v1.TestService"}],
		"retryPolicy":{"maxAttempts":%d,"initialBackoff":"0.05s","maxBackoff":"1s",
		"backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]%s}`, Attempts, t)
}

// retryableGRPC is what failsafegrpc's retry policy handles, kept for its
// circuit breaker too.
func retryableGRPC(_ any, err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
		return err != nil
	}
	return false
}

// Stacks returns every stack, "none" first (the baseline of the overhead
// comparison).
func Stacks() []Stack {
	return []Stack{
		{
			Name: "none", Desc: "no interceptor, no retries", Streams: true,
			build: func(*Opens) (testsvc.Config, error) { return testsvc.Config{}, nil },
		},
		{
			Name: "ggm-retry",
			Desc: "go-grpc-middleware v2.3.4 retry: WithMax(3), UNAVAILABLE, exponential backoff with full jitter (25 ms x U(0,2) doubling, cap 1 s); its stream interceptor refuses bidi streams, so none on streams",
			build: func(*Opens) (testsvc.Config, error) {
				ic := retry.UnaryClientInterceptor(
					retry.WithMax(Attempts),
					retry.WithCodes(codes.Unavailable),
					retry.WithBackoff(retry.BackoffExponentialWithJitterBounded(backoffBase/2, 1, backoffCap)),
				)
				return testsvc.Config{DialOptions: func(int) []grpc.DialOption {
					return []grpc.DialOption{grpc.WithChainUnaryInterceptor(ic)}
				}}, nil
			},
		},
		{
			Name: "grpc-retry", Streams: true,
			Desc: "grpc-go built-in retryPolicy: maxAttempts 3, UNAVAILABLE, initialBackoff 50 ms, multiplier 2, maxBackoff 1 s (full jitter)",
			build: func(*Opens) (testsvc.Config, error) {
				sc := serviceConfig(false)
				return testsvc.Config{DialOptions: func(int) []grpc.DialOption {
					return []grpc.DialOption{grpc.WithDefaultServiceConfig(sc)}
				}}, nil
			},
		},
		{
			Name: "grpc-retry-throttle", Streams: true,
			Desc: "grpc-retry plus retryThrottling {maxTokens 10, tokenRatio 0.1}",
			build: func(*Opens) (testsvc.Config, error) {
				sc := serviceConfig(true)
				return testsvc.Config{DialOptions: func(int) []grpc.DialOption {
					return []grpc.DialOption{grpc.WithDefaultServiceConfig(sc)}
				}}, nil
			},
		},
		{
			Name: "failsafe-budget",
			Desc: "failsafe-go v0.9.8 failsafegrpc unary interceptor: retry policy WithMaxAttempts(3), backoff 25 ms doubling to 500 ms with jitter factor 1 (U(0, 2d)), with budget.New() (maxRate 0.2 of in-flight executions, minConcurrency 3); failsafegrpc has no stream interceptor",
			build: func(*Opens) (testsvc.Config, error) {
				return testsvc.Config{DialOptions: func(int) []grpc.DialOption {
					rp := failsafeRetry().WithBudget(fsbudget.New()).Build()
					return []grpc.DialOption{grpc.WithChainUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptor[any](rp))}
				}}, nil
			},
		},
		{
			Name: "failsafe-breaker", HasBreaker: true,
			Desc: "failsafe-go retry as failsafe-budget (no budget) around a circuit breaker per hop: failure rate 50 % of >= 100 executions in 10 s, delay 1 s, 3 successes to close (stormguard's breaker defaults)",
			build: func(opens *Opens) (testsvc.Config, error) {
				return testsvc.Config{DialOptions: func(hop int) []grpc.DialOption {
					rp := failsafeRetry().Build()
					cb := circuitbreaker.NewBuilder[any]().
						HandleIf(retryableGRPC).
						WithFailureRateThreshold(0.5, 100, 10*time.Second).
						WithDelay(time.Second).
						WithSuccessThreshold(3).
						OnOpen(func(circuitbreaker.StateChangedEvent) { opens.add(hop) }).
						Build()
					// The retry policy is outermost: every attempt passes
					// the breaker.
					ex := fsgo.With[any](rp, cb)
					return []grpc.DialOption{grpc.WithChainUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptorWithExecutor(ex))}
				}}, nil
			},
		},
		{
			Name: "stormguard", Streams: true, HasBreaker: true,
			Desc: "stormguard defaults: WithBudget(budget.Config{}) (20 % over 10 s + 10/s floor) and WithBreaker(breaker.NewSet(breaker.Config{}, 0)) on every hop, server interceptors on every tier, 3 attempts, full jitter 50 ms / cap 1 s",
			build: func(opens *Opens) (testsvc.Config, error) {
				return stormguardConfig(opens, func() interceptor.Option { return interceptor.WithBudget(budget.Config{}) })
			},
		},
		{
			Name: "stormguard-adaptive", Streams: true,
			Desc:  "the client side of stormguard's recommended configuration (interceptor.Recommended; its server side, admission control, matters in the slow scenario only): WithAdaptive(adaptive.NewSet(adaptive.Config{}, 0)) (proportional shedding K 3 over 1 s; down on evidence: 8 overload failures in a row behind a ready connection, 1 on a broken one, none accepted for 50 ms; probes 5 % / 50 ms) and WithBudget(budget.Config{}), no breaker, on every hop; server interceptors on every tier",
			build: func(*Opens) (testsvc.Config, error) { return stormguardAdaptiveConfig() },
		},
		{
			Name: "failsafe-adaptive",
			Desc: "failsafe-go v0.9.8 failsafegrpc: retry policy as failsafe-budget with budget.New(), around adaptivethrottler.NewWithDefaults (its rejection rate from the failure rate over its default window), per hop",
			build: func(*Opens) (testsvc.Config, error) {
				return testsvc.Config{DialOptions: func(int) []grpc.DialOption {
					rp := failsafeRetry().WithBudget(fsbudget.New()).Build()
					at := adaptivethrottler.NewBuilder[any]().HandleIf(retryableGRPC).Build()
					ex := fsgo.With[any](rp, at)
					return []grpc.DialOption{grpc.WithChainUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptorWithExecutor(ex))}
				}}, nil
			},
		},
		{
			Name: "stormguard-throttle", Streams: true, HasBreaker: true,
			Desc: "stormguard with WithThrottle(budget.ThrottleConfig{}) (gRFC A6, 10 / 0.1) instead of the budget, plus the breaker",
			build: func(opens *Opens) (testsvc.Config, error) {
				return stormguardConfig(opens, func() interceptor.Option { return interceptor.WithThrottle(budget.ThrottleConfig{}) })
			},
		},
	}
}

// failsafeRetry is failsafegrpc's retry policy (UNAVAILABLE,
// DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED) with 3 attempts and a backoff
// as close to full jitter as failsafe-go allows: 25 ms doubling, each delay
// multiplied by U(0, 2), so U(0, 50 ms) and then U(0, 100 ms).
func failsafeRetry() retrypolicy.Builder[any] {
	return failsafegrpc.NewRetryPolicyBuilder[any]().
		WithMaxAttempts(Attempts).
		WithBackoff(backoffBase/2, backoffCap/2).
		WithJitterFactor(1)
}

// stormguardConfig installs stormguard on every hop, with a fresh limiter
// from limiter and a fresh breaker set per hop, and its server interceptors
// on every tier.
func stormguardConfig(opens *Opens, limiter func() interceptor.Option) (testsvc.Config, error) {
	// Validate the options once, so that a bad configuration is an error
	// here rather than failed calls later.
	if _, err := interceptor.New(limiter()); err != nil {
		return testsvc.Config{}, err
	}
	if _, err := breaker.NewSet(breaker.Config{}, 0); err != nil {
		return testsvc.Config{}, err
	}
	srv, err := interceptor.New()
	if err != nil {
		return testsvc.Config{}, err
	}
	return testsvc.Config{
		DialOptions: func(hop int) []grpc.DialOption {
			// The config was validated above, so NewSet cannot fail.
			set, _ := breaker.NewSet(breaker.Config{OnStateChange: func(_ string, _, to breaker.State) {
				if to == breaker.Open {
					opens.add(hop)
				}
			}}, 0)
			// interceptor.DialOptions fails every call if the options
			// were invalid; they were validated above.
			return interceptor.DialOptions(limiter(), interceptor.WithBreaker(set))
		},
		ServerOptions: func(int) []grpc.ServerOption { return srv.ServerOptions() },
	}, nil
}

// stormguardAdaptiveConfig installs the recommended configuration on every
// hop: a fresh adaptive throttle set and budget per hop, the server
// interceptors on every tier.
func stormguardAdaptiveConfig() (testsvc.Config, error) {
	if _, err := adaptive.NewSet(adaptive.Config{}, 0); err != nil {
		return testsvc.Config{}, err
	}
	srv, err := interceptor.New()
	if err != nil {
		return testsvc.Config{}, err
	}
	return testsvc.Config{
		DialOptions: func(int) []grpc.DialOption {
			set, _ := adaptive.NewSet(adaptive.Config{}, 0) // validated above
			return interceptor.DialOptions(interceptor.WithAdaptive(set), interceptor.WithBudget(budget.Config{}))
		},
		ServerOptions: func(int) []grpc.ServerOption { return srv.ServerOptions() },
	}, nil
}
