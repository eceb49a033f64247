package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
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
	"google.golang.org/grpc/health" // also registers the client-side health checker
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/admission"
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
	// Stormguard is true for a stack built from stormguard's
	// interceptors: the only ones that report to an observer.
	Stormguard bool
	// serviceConfig is the default service config of every hop ("" for
	// none); Instance merges round_robin into it when asked.
	serviceConfig string
	// build returns the chain configuration of one fresh instance of the
	// stack (fresh budgets, throttles and breakers, one set per hop, as
	// separate processes would have).
	build func(e *env) (testsvc.Config, error)
}

// env is what a stack's build needs to know about the instance.
type env struct {
	opens *Opens // breaker openings per hop
	tiers int    // number of tiers of the chain
	obs   func(tier int) interceptor.Observer
}

// observer returns the observer for tier's stormguard interceptors, nil
// for none.
func (e *env) observer(tier int) interceptor.Observer {
	if e.obs == nil {
		return nil
	}
	return e.obs(tier)
}

// withObserver returns opts with tier's observer, if it has one.
func (e *env) withObserver(tier int, opts ...interceptor.Option) []interceptor.Option {
	if o := e.observer(tier); o != nil {
		return append(opts, interceptor.WithObserver(o))
	}
	return opts
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
	return s.Instance(InstanceOptions{Tiers: tiers, Seed: seed})
}

// InstanceOptions say how to build an instance of a stack. The zero value
// is New(nil, 0).
type InstanceOptions struct {
	// Tiers names the chain's tiers; nil means the default three.
	Tiers []string
	// Seed seeds the chain's random faults.
	Seed uint64
	// Observer, if not nil, returns the observer of tier i's stormguard
	// interceptors: its server's and its client's to tier i+1; tier -1
	// is the edge client. It may return nil. Stacks that are not
	// stormguard's ignore it.
	Observer func(tier int) interceptor.Observer
	// RoundRobin spreads every hop's calls over all the addresses its
	// resolver returns (several replicas of the next tier): round_robin,
	// merged into the stack's own service config. A stack whose service
	// config already names a balancer keeps it.
	RoundRobin bool
}

// Instance returns a fresh instance of s.
func (s Stack) Instance(o InstanceOptions) (*Instance, error) {
	tiers := len(o.Tiers)
	if tiers == 0 {
		tiers = len(testsvc.DefaultTiers)
	}
	e := &env{opens: new(Opens), tiers: tiers, obs: o.Observer}
	cfg, err := s.build(e)
	if err != nil {
		return nil, fmt.Errorf("stack %s: %w", s.Name, err)
	}
	sc, err := withRoundRobin(s.serviceConfig, o.RoundRobin)
	if err != nil {
		return nil, fmt.Errorf("stack %s: %w", s.Name, err)
	}
	if sc != "" {
		dial := cfg.DialOptions
		cfg.DialOptions = func(hop int) []grpc.DialOption {
			var opts []grpc.DialOption
			if dial != nil {
				opts = dial(hop)
			}
			return append(opts, grpc.WithDefaultServiceConfig(sc))
		}
	}
	cfg.Tiers, cfg.Seed = o.Tiers, o.Seed
	return &Instance{Config: cfg, opens: e.opens}, nil
}

// withRoundRobin returns the service config sc (JSON; "" for none) with
// round_robin as its balancer when rr is set and sc names none. A
// default service config replaces rather than merges, so the balancer
// must go into the stack's own.
func withRoundRobin(sc string, rr bool) (string, error) {
	if !rr {
		return sc, nil
	}
	m := map[string]any{}
	if sc != "" {
		if err := json.Unmarshal([]byte(sc), &m); err != nil {
			return "", fmt.Errorf("service config: %w", err)
		}
	}
	if _, ok := m["loadBalancingConfig"]; !ok {
		m["loadBalancingConfig"] = []any{map[string]any{"round_robin": map[string]any{}}}
	}
	b, err := json.Marshal(m)
	return string(b), err
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
			build: func(*env) (testsvc.Config, error) { return testsvc.Config{}, nil },
		},
		{
			Name: "ggm-retry",
			Desc: "go-grpc-middleware v2.3.4 retry: WithMax(3), UNAVAILABLE, exponential backoff with full jitter (25 ms x U(0,2) doubling, cap 1 s); its stream interceptor refuses bidi streams, so none on streams",
			build: func(*env) (testsvc.Config, error) {
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
			Desc:          "grpc-go built-in retryPolicy: maxAttempts 3, UNAVAILABLE, initialBackoff 50 ms, multiplier 2, maxBackoff 1 s (full jitter)",
			serviceConfig: serviceConfig(false),
			build:         func(*env) (testsvc.Config, error) { return testsvc.Config{}, nil },
		},
		{
			Name: "grpc-retry-throttle", Streams: true,
			Desc:          "grpc-retry plus retryThrottling {maxTokens 10, tokenRatio 0.1}",
			serviceConfig: serviceConfig(true),
			build:         func(*env) (testsvc.Config, error) { return testsvc.Config{}, nil },
		},
		{
			Name: "failsafe-budget",
			Desc: "failsafe-go v0.9.8 failsafegrpc unary interceptor: retry policy WithMaxAttempts(3), backoff 25 ms doubling to 500 ms with jitter factor 1 (U(0, 2d)), with budget.New() (maxRate 0.2 of in-flight executions, minConcurrency 3); failsafegrpc has no stream interceptor",
			build: func(*env) (testsvc.Config, error) {
				return testsvc.Config{DialOptions: func(int) []grpc.DialOption {
					rp := failsafeRetry().WithBudget(fsbudget.New()).Build()
					return []grpc.DialOption{grpc.WithChainUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptor[any](rp))}
				}}, nil
			},
		},
		{
			Name: "failsafe-breaker", HasBreaker: true,
			Desc: "failsafe-go retry as failsafe-budget (no budget) around a circuit breaker per hop: failure rate 50 % of >= 100 executions in 10 s, delay 1 s, 3 successes to close (stormguard's breaker defaults)",
			build: func(e *env) (testsvc.Config, error) {
				return testsvc.Config{DialOptions: func(hop int) []grpc.DialOption {
					rp := failsafeRetry().Build()
					cb := circuitbreaker.NewBuilder[any]().
						HandleIf(retryableGRPC).
						WithFailureRateThreshold(0.5, 100, 10*time.Second).
						WithDelay(time.Second).
						WithSuccessThreshold(3).
						OnOpen(func(circuitbreaker.StateChangedEvent) { e.opens.add(hop) }).
						Build()
					// The retry policy is outermost: every attempt passes
					// the breaker.
					ex := fsgo.With[any](rp, cb)
					return []grpc.DialOption{grpc.WithChainUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptorWithExecutor(ex))}
				}}, nil
			},
		},
		{
			Name: "stormguard", Streams: true, HasBreaker: true, Stormguard: true,
			Desc: "stormguard defaults: WithBudget(budget.Config{}) (20 % over 10 s + 10/s floor) and WithBreaker(breaker.NewSet(breaker.Config{}, 0)) on every hop, server interceptors on every tier, 3 attempts, full jitter 50 ms / cap 1 s",
			build: func(e *env) (testsvc.Config, error) {
				return stormguardConfig(e, func() interceptor.Option { return interceptor.WithBudget(budget.Config{}) })
			},
		},
		{
			Name: "stormguard-adaptive", Streams: true, Stormguard: true,
			Desc:  "the client side of stormguard's recommended configuration (interceptor.Recommended; its server side, admission control, matters in the slow scenario only): WithAdaptive(adaptive.NewSet(adaptive.Config{}, 0)) (proportional shedding K 3 over 1 s; down on evidence: 8 overload failures in a row behind a ready connection, 1 on a broken one, none accepted for 50 ms; probes 5 % / 50 ms) and WithBudget(budget.Config{}), no breaker, on every hop; server interceptors on every tier",
			build: stormguardAdaptiveConfig,
		},
		{
			Name: "failsafe-adaptive",
			Desc: "failsafe-go v0.9.8 failsafegrpc: retry policy as failsafe-budget with budget.New(), around adaptivethrottler.NewWithDefaults (its rejection rate from the failure rate over its default window), per hop",
			build: func(*env) (testsvc.Config, error) {
				return testsvc.Config{DialOptions: func(int) []grpc.DialOption {
					rp := failsafeRetry().WithBudget(fsbudget.New()).Build()
					at := adaptivethrottler.NewBuilder[any]().HandleIf(retryableGRPC).Build()
					ex := fsgo.With[any](rp, at)
					return []grpc.DialOption{grpc.WithChainUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptorWithExecutor(ex))}
				}}, nil
			},
		},
		{
			Name: "stormguard-throttle", Streams: true, HasBreaker: true, Stormguard: true,
			Desc: "stormguard with WithThrottle(budget.ThrottleConfig{}) (gRFC A6, 10 / 0.1) instead of the budget, plus the breaker",
			build: func(e *env) (testsvc.Config, error) {
				return stormguardConfig(e, func() interceptor.Option { return interceptor.WithThrottle(budget.ThrottleConfig{}) })
			},
		},
		{
			Name: "recommended", Streams: true, Stormguard: true,
			Desc:  "exactly README's line on every service: one interceptor.New(interceptor.Recommended()...) per tier (adaptive throttle, budget, admission control at their defaults), its dial options on the tier's client and its server options on the tier's server; the edge client has its own",
			build: func(e *env) (testsvc.Config, error) { return recommendedConfig(e, false) },
		},
		{
			Name: "recommended-health", Streams: true, Stormguard: true,
			Desc:          "README's fleet set-up on every service: recommended plus interceptor.WithHealth(health.NewServer(), admission.ServingConfig{}) on each tier's server with the health server registered, and grpc.WithDefaultServiceConfig(interceptor.HealthServiceConfig) (round_robin and health checking) on every client",
			serviceConfig: interceptor.HealthServiceConfig,
			build:         func(e *env) (testsvc.Config, error) { return recommendedConfig(e, true) },
		},
	}
}

// AllStacks returns Stacks and then DiagnosticStacks: every stack a
// tier or a run can be given by name.
func AllStacks() []Stack { return append(Stacks(), DiagnosticStacks()...) }

// DiagnosticStacks returns stacks that take one part of stormguard
// apart to measure what it costs: they run in no scenario, only where
// named (a tier's --stack).
func DiagnosticStacks() []Stack {
	return []Stack{{
		Name:  "noop-interceptor",
		Desc:  "no interceptor but one that passes every call a tier makes (not the edge's) on untouched: what a unary client interceptor costs by itself",
		build: tierClients(func(ctx context.Context, _ int) context.Context { return ctx }),
	}, {
		Name: "stack-pad",
		Desc: "no interceptor but a server one on every tier that runs the handler below a 1 KB stack frame, as a handler that does a little more than forward would: what a deeper handler stack costs by itself (the stack growth of each request's goroutine)",
		build: func(*env) (testsvc.Config, error) {
			return withStackPad(testsvc.Config{}), nil
		},
	}, {
		Name: "recommended-stack-pad", Stormguard: true,
		Desc: "recommended on a chain whose handlers run below stack-pad's 1 KB frame: what stormguard costs where the handler's stack is not right at the edge of its size",
		build: func(e *env) (testsvc.Config, error) {
			cfg, err := recommendedConfig(e, false)
			return withStackPad(cfg), err
		},
	}, {
		Name: "recommended-hedging", Stormguard: true,
		Desc:  "recommended plus interceptor.WithHedging(interceptor.Hedging{}) on every hop (the edge hedges, the tiers below see its mark and do not): what hedging costs where it must stay silent",
		build: func(e *env) (testsvc.Config, error) { return hedgingConfig(e, func(int) bool { return true }) },
	}, {
		Name: "depth-header",
		Desc: "no interceptor but one that adds x-call-depth to every call a tier makes (not the edge's), as stormguard's first attempts do: what carrying the attempt metadata costs by itself",
		build: tierClients(func(ctx context.Context, hop int) context.Context {
			return metadata.AppendToOutgoingContext(ctx, interceptor.MetadataDepth, strconv.Itoa(hop))
		}),
	}}
}

// tierClients builds a stack with one unary client interceptor on the
// client of every tier (not the edge's), which sends each call with the
// context with returns for it and the hop.
func tierClients(with func(ctx context.Context, hop int) context.Context) func(*env) (testsvc.Config, error) {
	return func(*env) (testsvc.Config, error) {
		return testsvc.Config{DialOptions: func(hop int) []grpc.DialOption {
			if hop == 0 {
				return nil
			}
			return []grpc.DialOption{grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				return invoker(with(ctx, hop), method, req, reply, cc, opts...)
			})}
		}}, nil
	}
}

// withStackPad adds, outermost on every tier's server, an interceptor
// that runs the rest below a 1 KB frame (padded).
func withStackPad(cfg testsvc.Config) testsvc.Config {
	own := cfg.ServerOptions
	cfg.ServerOptions = func(tier int) []grpc.ServerOption {
		pad := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return padded(len(info.FullMethod), func() (any, error) { return h(ctx, req) })
		})
		if own == nil {
			return []grpc.ServerOption{pad}
		}
		return append([]grpc.ServerOption{pad}, own(tier)...)
	}
	return cfg
}

// padded runs f below a frame of 1 KB that stays live across the call.
//
//go:noinline
func padded(n int, f func() (any, error)) (any, error) {
	var pad [1024]byte
	pad[n%len(pad)] = 1
	r, err := f()
	if pad[(n+1)%len(pad)] != 0 { // never: keeps pad live across f
		return nil, nil
	}
	return r, err
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
func stormguardConfig(e *env, limiter func() interceptor.Option) (testsvc.Config, error) {
	// Validate the options once, so that a bad configuration is an error
	// here rather than failed calls later.
	if _, err := interceptor.New(limiter()); err != nil {
		return testsvc.Config{}, err
	}
	if _, err := breaker.NewSet(breaker.Config{}, 0); err != nil {
		return testsvc.Config{}, err
	}
	srv, err := serversPerTier(e)
	if err != nil {
		return testsvc.Config{}, err
	}
	return testsvc.Config{
		DialOptions: func(hop int) []grpc.DialOption {
			// The config was validated above, so NewSet cannot fail.
			set, _ := breaker.NewSet(breaker.Config{OnStateChange: func(_ string, _, to breaker.State) {
				if to == breaker.Open {
					e.opens.add(hop)
				}
			}}, 0)
			// interceptor.DialOptions fails every call if the options
			// were invalid; they were validated above.
			return interceptor.DialOptions(e.withObserver(hop-1, limiter(), interceptor.WithBreaker(set))...)
		},
		ServerOptions: srv,
	}, nil
}

// serversPerTier returns the server options of stormguard's server
// interceptors at their defaults, one Interceptors per tier (each with its
// tier's observer).
func serversPerTier(e *env) (func(tier int) []grpc.ServerOption, error) {
	srv := make([]*interceptor.Interceptors, e.tiers)
	for i := range srv {
		var err error
		if srv[i], err = interceptor.New(e.withObserver(i)...); err != nil {
			return nil, err
		}
	}
	return func(tier int) []grpc.ServerOption { return srv[tier].ServerOptions() }, nil
}

// stormguardAdaptiveConfig installs the client side of the recommended
// configuration on every hop: a fresh adaptive throttle set and budget per
// hop, the server interceptors on every tier.
func stormguardAdaptiveConfig(e *env) (testsvc.Config, error) {
	if _, err := adaptive.NewSet(adaptive.Config{}, 0); err != nil {
		return testsvc.Config{}, err
	}
	srv, err := serversPerTier(e)
	if err != nil {
		return testsvc.Config{}, err
	}
	return testsvc.Config{
		DialOptions: func(hop int) []grpc.DialOption {
			set, _ := adaptive.NewSet(adaptive.Config{}, 0) // validated above
			return interceptor.DialOptions(e.withObserver(hop-1, interceptor.WithAdaptive(set), interceptor.WithBudget(budget.Config{}))...)
		},
		ServerOptions: srv,
	}, nil
}

// recommendedConfig is README's "Use it": one Interceptors per service
// (tier), built once from Recommended(), whose dial options go on the
// tier's client and whose server options go on its server; the edge
// client (tier -1) has its own. With health, every tier's server also
// runs WithHealth on a health server registered on it; the clients'
// HealthServiceConfig comes from the stack's serviceConfig.
func recommendedConfig(e *env, withHealth bool) (testsvc.Config, error) {
	sg := make([]*interceptor.Interceptors, e.tiers+1) // sg[tier+1]
	hs := make([]*health.Server, e.tiers+1)
	for i := range sg {
		opts := interceptor.Recommended()
		if withHealth && i > 0 {
			hs[i] = health.NewServer()
			opts = append(opts, interceptor.WithHealth(hs[i], admission.ServingConfig{}))
		}
		var err error
		if sg[i], err = interceptor.New(e.withObserver(i-1, opts...)...); err != nil {
			return testsvc.Config{}, err
		}
	}
	cfg := testsvc.Config{
		// Hop h is the client inside tier h-1: sg[h].
		DialOptions:   func(hop int) []grpc.DialOption { return sg[hop].DialOptions() },
		ServerOptions: func(tier int) []grpc.ServerOption { return sg[tier+1].ServerOptions() },
	}
	if withHealth {
		cfg.Register = func(tier int, srv *grpc.Server) { healthpb.RegisterHealthServer(srv, hs[tier+1]) }
	}
	return cfg, nil
}
