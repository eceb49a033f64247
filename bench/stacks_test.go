package bench

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDownOne checks the wiring of every stack on the headline scenario:
// one user request with payment down. The counts are exact for every
// stack: no timing decides them.
func TestDownOne(t *testing.T) {
	want := map[string][3]int64{
		"none":                {1, 1, 1},
		"ggm-retry":           {3, 9, 27},
		"grpc-retry":          {3, 9, 27},
		"grpc-retry-throttle": {3, 6, 9},
		"failsafe-budget":     {3, 9, 27},
		"failsafe-breaker":    {3, 9, 27},
		"stormguard":          {1, 1, 3},
		"stormguard-throttle": {1, 1, 3},
	}
	// Some stacks decide by time or chance: stormguard's adaptive throttle
	// (stormguard-adaptive, recommended, recommended-health)
	// retries only a lone failure when the warm-up's accept is 50 ms old
	// or more, and marks payment down at once when its channel is broken
	// (so 1 to 3 calls, by the machine's speed), and
	// failsafe-go's adaptive throttler rejects at random (and its
	// rejection is not a gRPC status: the user gets Unknown). For them
	// only the wiring is checked: the request reached payment, at most 3
	// times for stormguard, at most 3^3 for failsafe-go.
	loose := map[string]int64{"stormguard-adaptive": 3, "failsafe-adaptive": 27, "recommended": 3, "recommended-health": 3}
	for _, s := range Stacks() {
		t.Run(s.Name, func(t *testing.T) {
			r, err := RunDownOne(s, DefaultParams)
			if err != nil {
				t.Fatal(err)
			}
			if most, ok := loose[s.Name]; ok {
				if r.Received[2] < 1 || r.Received[2] > most {
					t.Errorf("calls at payment: got %d, want 1 to %d", r.Received[2], most)
				}
				return
			}
			if r.Code != codes.Unavailable {
				t.Errorf("user got %v, want Unavailable", r.Code)
			}
			if w, ok := want[s.Name]; !ok || r.Received != w {
				t.Errorf("calls received (gateway, order, payment): got %v, want %v", r.Received, w)
			}
		})
	}
}

func TestWithRoundRobin(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `{"loadBalancingConfig":[{"round_robin":{}}]}`},
		{`{"methodConfig":[]}`, `{"loadBalancingConfig":[{"round_robin":{}}],"methodConfig":[]}`},
		{`{"loadBalancingConfig":[{"pick_first":{}}]}`, `{"loadBalancingConfig":[{"pick_first":{}}]}`},
	} {
		got, err := withRoundRobin(tc.in, true)
		if err != nil || got != tc.want {
			t.Errorf("withRoundRobin(%q): got %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if got, err := withRoundRobin(`{"x":1}`, false); got != `{"x":1}` || err != nil {
		t.Errorf("withRoundRobin off: got %q, %v; want the config untouched", got, err)
	}
	if _, err := withRoundRobin(`{`, true); err == nil {
		t.Error("withRoundRobin of invalid JSON: no error")
	}
}

// receivedCounter counts the requests a tier's server received.
type receivedCounter struct{ n atomic.Int64 }

func (c *receivedCounter) Observe(_ context.Context, e interceptor.Event) {
	if e.Kind == interceptor.EventRequestReceived {
		c.n.Add(1)
	}
}

// TestStormguardStacksObserved: every stormguard stack reports each
// tier's events to that tier's observer, and recommended-health serves
// gRPC health on every tier.
func TestStormguardStacksObserved(t *testing.T) {
	for _, s := range Stacks() {
		if !s.Stormguard {
			continue
		}
		t.Run(s.Name, func(t *testing.T) {
			obs := make([]receivedCounter, len(testsvc.DefaultTiers)+1)
			inst, err := s.Instance(InstanceOptions{Observer: func(tier int) interceptor.Observer { return &obs[tier+1] }})
			if err != nil {
				t.Fatal(err)
			}
			c := testsvc.New(t, inst.Config)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{Id: "1"}); err != nil {
				t.Fatal(err)
			}
			for tier := range testsvc.DefaultTiers {
				if got := obs[tier+1].n.Load(); got != 1 {
					t.Errorf("tier %d: observer saw %d requests received, want 1", tier, got)
				}
			}
			if s.Name != "recommended-health" {
				return
			}
			for tier := range testsvc.DefaultTiers {
				resp, err := healthpb.NewHealthClient(c.Conn(tier)).Check(ctx, &healthpb.HealthCheckRequest{})
				if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Errorf("tier %d: health Check: %v, %v; want SERVING", tier, resp.GetStatus(), err)
				}
			}
		})
	}
}

// TestDiagnosticStacks: each diagnostic stack serves a call through the
// chain, and depth-header delivers x-call-depth as stormguard's first
// attempts do (recommended-stack-pad is stormguard): none to gateway, 1
// to order, 2 to payment.
func TestDiagnosticStacks(t *testing.T) {
	for _, s := range DiagnosticStacks() {
		t.Run(s.Name, func(t *testing.T) {
			inst, err := s.Instance(InstanceOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var got [3]atomic.Value
			cfg := inst.Config
			own := cfg.ServerOptions
			cfg.ServerOptions = func(tier int) []grpc.ServerOption {
				seen := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
					got[tier].Store(strings.Join(metadata.ValueFromIncomingContext(ctx, interceptor.MetadataDepth), ","))
					return h(ctx, req)
				})
				if own == nil {
					return []grpc.ServerOption{seen}
				}
				return append([]grpc.ServerOption{seen}, own(tier)...)
			}
			c := testsvc.New(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{Id: "1"}); err != nil {
				t.Fatal(err)
			}
			want := [3]string{"", "", ""}
			if s.Name == "depth-header" || s.Stormguard {
				want = [3]string{"", "1", "2"}
			}
			for tier := range got {
				if v, _ := got[tier].Load().(string); v != want[tier] {
					t.Errorf("tier %d received x-call-depth %q, want %q", tier, v, want[tier])
				}
			}
		})
	}
}
