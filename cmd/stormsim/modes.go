package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/adaptive"
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

// mode is one retry stack, put on every hop of the chain: dial gives the
// client side of hop (0 is the edge client, hop i > 0 the client inside
// tier i-1), server the server side of a tier. Each call builds fresh
// interceptors, so that every hop has its own budget and breakers.
type mode struct {
	name   string
	about  string
	dial   func(tm *telemetry) ([]grpc.DialOption, error)
	server func(tm *telemetry) ([]grpc.ServerOption, error) // nil: no server interceptor
}

var modes = []mode{
	{
		name:  "naive",
		about: "go-grpc-middleware retry, WithMax(3) on every hop, exponential backoff 25 ms x 2^n +-20 % jitter",
		dial:  naiveDial(3),
	},
	{
		name:  "one-retry",
		about: "go-grpc-middleware retry, WithMax(2) on every hop, same backoff",
		dial:  naiveDial(2),
	},
	{
		name:  "budget",
		about: "stormguard client only: 3 attempts under a retry budget per hop; upstream retries ignored, no server interceptor",
		dial: stormguardDial(func(*telemetry) ([]interceptor.Option, error) {
			return []interceptor.Option{
				interceptor.WithMaxAttempts(3),
				interceptor.WithBudget(budget.Config{}),
				interceptor.WithTierPolicy(func(_ interceptor.Info, configured int) int { return configured }),
			}, nil
		}),
	},
	{
		name:   "tiered",
		about:  "stormguard client and server: attempt metadata and don't-retry pushback, no budget or breaker",
		dial:   stormguardDial(func(*telemetry) ([]interceptor.Option, error) { return nil, nil }),
		server: stormguardServer,
	},
	{
		name:  "stormguard",
		about: "stormguard client and server with a retry budget and circuit breakers per hop (the breaker stack: fastest at a dead target from a cold start)",
		dial: stormguardDial(func(tm *telemetry) ([]interceptor.Option, error) {
			set, err := breaker.NewSet(tm.breakerConfig(), 0)
			if err != nil {
				return nil, err
			}
			tm.trackBreakers(set)
			return []interceptor.Option{interceptor.WithBudget(budget.Config{}), interceptor.WithBreaker(set)}, nil
		}),
		server: stormguardServer,
	},
	{
		name:  "adaptive",
		about: "stormguard client and server with an adaptive throttle and a retry budget per hop, no breaker (interceptor.Recommended's client side: incidents after healthy traffic, partial loss, hangs, recovery)",
		dial: stormguardDial(func(*telemetry) ([]interceptor.Option, error) {
			set, err := adaptive.NewSet(adaptive.Config{}, 0)
			if err != nil {
				return nil, err
			}
			return []interceptor.Option{interceptor.WithBudget(budget.Config{}), interceptor.WithAdaptive(set)}, nil
		}),
		server: stormguardServer,
	},
}

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
		out = append(out, m)
	}
	return out, nil
}

func naiveDial(maxAttempts uint) func(*telemetry) ([]grpc.DialOption, error) {
	return func(*telemetry) ([]grpc.DialOption, error) {
		return []grpc.DialOption{grpc.WithChainUnaryInterceptor(retry.UnaryClientInterceptor(
			retry.WithMax(maxAttempts),
			retry.WithBackoff(retry.BackoffExponentialWithJitter(naiveBackoffBase, naiveBackoffJitter)),
		))}, nil
	}
}

func stormguardDial(opts func(*telemetry) ([]interceptor.Option, error)) func(*telemetry) ([]grpc.DialOption, error) {
	return func(tm *telemetry) ([]grpc.DialOption, error) {
		o, err := opts(tm)
		if err != nil {
			return nil, err
		}
		ic, err := interceptor.New(append(o, tm.options()...)...)
		if err != nil {
			return nil, err
		}
		tm.trackLimiters(ic)
		return ic.DialOptions(), nil
	}
}

// stormguardServer installs stormguard's server interceptors for the test
// service only: the demo's own stats RPC (polled by stormsim load) must not
// show up in the tier's request metrics.
func stormguardServer(tm *telemetry) ([]grpc.ServerOption, error) {
	ic, err := interceptor.New(tm.options()...)
	if err != nil {
		return nil, err
	}
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
	}, nil
}
