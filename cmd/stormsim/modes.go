package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Naive retries wait like a typical production config: exponential backoff
// with jitter, 25 ms before the first retry and 50 ms before the second, each
// +-20 % (go-grpc-middleware's BackoffExponentialWithJitter).
const (
	naiveBackoffBase   = 25 * time.Millisecond
	naiveBackoffJitter = 0.2
)

// stack is what a mode puts on one process of the chain, the edge client
// or a tier: the dial options of the connection it makes and the options
// of its server (nil: no server interceptor). A stormguard mode builds one
// Interceptors per process and takes both sides from it, as README "Use
// it" tells users to: a tier's server side (admission control, in
// recommended) and its client side are one instance.
type stack struct {
	dial   []grpc.DialOption
	server []grpc.ServerOption
	ic     *interceptor.Interceptors // both sides' instance; nil without stormguard
}

// mode is one retry stack, put on every process of the chain. process
// builds a fresh stack for one process each time it is called, so that
// every hop has its own budget, throttles and breakers, and every server
// its own admission limiter.
type mode struct {
	name    string
	about   string
	process func(tm *telemetry) (stack, error)
}

var modes = []mode{
	{
		name:    "naive",
		about:   "go-grpc-middleware retry, WithMax(3) on every hop, exponential backoff 25 ms x 2^n +-20 % jitter",
		process: naiveProcess(3),
	},
	{
		name:    "one-retry",
		about:   "go-grpc-middleware retry, WithMax(2) on every hop, same backoff",
		process: naiveProcess(2),
	},
	{
		name:  "budget",
		about: "stormguard client only: 3 attempts under a retry budget per hop; upstream retries ignored, no server interceptor",
		process: stormguardProcess(false, func(*telemetry) ([]interceptor.Option, error) {
			return []interceptor.Option{
				interceptor.WithMaxAttempts(3),
				interceptor.WithBudget(budget.Config{}),
				interceptor.WithTierPolicy(func(_ interceptor.Info, configured int) int { return configured }),
			}, nil
		}),
	},
	{
		name:    "tiered",
		about:   "stormguard client and server: attempt metadata and don't-retry pushback, no budget or breaker",
		process: stormguardProcess(true, func(*telemetry) ([]interceptor.Option, error) { return nil, nil }),
	},
	{
		name:  "stormguard",
		about: "stormguard client and server with a retry budget and circuit breakers per hop (the breaker stack: fastest at a dead target from a cold start)",
		process: stormguardProcess(true, func(tm *telemetry) ([]interceptor.Option, error) {
			set, err := breaker.NewSet(tm.breakerConfig(), 0)
			if err != nil {
				return nil, err
			}
			tm.trackBreakers(set)
			return []interceptor.Option{interceptor.WithBudget(budget.Config{}), interceptor.WithBreaker(set)}, nil
		}),
	},
	{
		name:  recommendedMode,
		about: "interceptor.New(interceptor.Recommended()...) on every process, client and server: adaptive throttle and retry budget per hop, admission control on every server, no breaker",
		process: stormguardProcess(true, func(*telemetry) ([]interceptor.Option, error) {
			return interceptor.Recommended(), nil
		}),
	},
}

// recommendedMode is the default mode of serve and load.
const recommendedMode = "recommended"

func modeNames() []string {
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = m.name
	}
	return names
}

func findMode(name string) (mode, error) {
	for _, m := range modes {
		if m.name == name {
			return m, nil
		}
	}
	if name == "adaptive" {
		return mode{}, fmt.Errorf("unknown mode %q: it is now %q, interceptor.Recommended() on every tier (want one of %s)", name, recommendedMode, strings.Join(modeNames(), ", "))
	}
	return mode{}, fmt.Errorf("unknown mode %q (want one of %s)", name, strings.Join(modeNames(), ", "))
}

// parseModes reads a comma-separated list of mode names; "all" or an empty
// list means every mode.
func parseModes(s string) ([]mode, error) {
	if s == "" || s == "all" {
		return modes, nil
	}
	var out []mode
	for name := range strings.SplitSeq(s, ",") {
		m, err := findMode(strings.TrimSpace(name))
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(out, func(o mode) bool { return o.name == m.name }) {
			return nil, fmt.Errorf("mode %q given twice", m.name)
		}
		out = append(out, m)
	}
	return out, nil
}

func naiveProcess(maxAttempts uint) func(*telemetry) (stack, error) {
	return func(*telemetry) (stack, error) {
		return stack{dial: []grpc.DialOption{grpc.WithChainUnaryInterceptor(retry.UnaryClientInterceptor(
			retry.WithMax(maxAttempts),
			retry.WithBackoff(retry.BackoffExponentialWithJitter(naiveBackoffBase, naiveBackoffJitter)),
		))}}, nil
	}
}

// stormguardProcess builds one Interceptors of the options opts returns
// (and the telemetry's) per process: its dial options, and with server
// its server options.
func stormguardProcess(server bool, opts func(*telemetry) ([]interceptor.Option, error)) func(*telemetry) (stack, error) {
	return func(tm *telemetry) (stack, error) {
		o, err := opts(tm)
		if err != nil {
			return stack{}, err
		}
		ic, err := interceptor.New(append(o, tm.options()...)...)
		if err != nil {
			return stack{}, err
		}
		tm.track(ic)
		st := stack{dial: ic.DialOptions(), ic: ic}
		if server {
			st.server = serverOptions(ic)
		}
		return st, nil
	}
}

// serverOptions installs ic's server interceptors for the test service
// only: the demo's own stats RPC (polled by stormsim load) must not show
// up in the tier's request metrics, nor meet its admission control.
func serverOptions(ic *interceptor.Interceptors) []grpc.ServerOption {
	unary := ic.UnaryServer()
	statsPrefix := "/" + testsvcv1.StatsService_ServiceDesc.ServiceName + "/"
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if strings.HasPrefix(info.FullMethod, statsPrefix) {
				return h(ctx, req)
			}
			return unary(ctx, req, info, h)
		}),
		grpc.ChainStreamInterceptor(ic.StreamServer()),
	}
}
