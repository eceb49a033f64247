package bench

import (
	"fmt"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/failsafegrpc"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/internal/testsvc"
)

// SlowParams sizes the slow-dependency scenario: payment serves from
// Workers workers at Service per call (capacity Workers/Service), then
// SlowService per call for SlowFor, after SlowBefore; open-loop arrivals
// at Rate per second; users wait Deadline; the retrying stacks bound each
// attempt by PerAttempt[hop] (hop 0 the edge client, 2 order's client).
type SlowParams struct {
	Seed        uint64
	Rate        int
	Workers     int
	Service     time.Duration
	SlowService time.Duration
	SlowBefore  time.Duration
	SlowFor     time.Duration
	SlowAfter   time.Duration
	Deadline    time.Duration
	PerAttempt  [3]time.Duration
	Slice       time.Duration
}

// DefaultSlowParams: 240 req/s against a payment of 4 workers at 10 ms
// (400/s), five times slower (80/s) for a second.
var DefaultSlowParams = SlowParams{
	Seed:        42,
	Rate:        240,
	Workers:     4,
	Service:     10 * time.Millisecond,
	SlowService: 50 * time.Millisecond,
	SlowBefore:  time.Second,
	SlowFor:     time.Second,
	SlowAfter:   2500 * time.Millisecond,
	Deadline:    500 * time.Millisecond,
	PerAttempt:  [3]time.Duration{400 * time.Millisecond, 250 * time.Millisecond, 150 * time.Millisecond},
	Slice:       250 * time.Millisecond,
}

// SlowStacks are the stacks of the slow-dependency scenario.
func SlowStacks(p SlowParams) []Stack {
	ggm := func(hop int) grpc.DialOption {
		return grpc.WithChainUnaryInterceptor(retry.UnaryClientInterceptor(
			retry.WithMax(Attempts),
			retry.WithCodes(codes.Unavailable, codes.DeadlineExceeded),
			retry.WithPerRetryTimeout(p.PerAttempt[min(hop, 2)]),
			retry.WithBackoff(retry.BackoffExponentialWithJitterBounded(backoffBase/2, 1, backoffCap)),
		))
	}
	timeouts := fmt.Sprintf("per-attempt timeouts %v / %v / %v (edge / gateway / order client)", p.PerAttempt[0], p.PerAttempt[1], p.PerAttempt[2])
	return []Stack{
		{
			Name: "none", Desc: "no interceptor, no retries",
			build: func(*env) (testsvc.Config, error) { return testsvc.Config{}, nil },
		},
		{
			Name: "ggm-retry", Desc: "go-grpc-middleware retry on every hop: WithMax(3), UNAVAILABLE and DEADLINE_EXCEEDED, WithPerRetryTimeout, " + timeouts,
			build: func(*env) (testsvc.Config, error) {
				return testsvc.Config{DialOptions: func(hop int) []grpc.DialOption { return []grpc.DialOption{ggm(hop)} }}, nil
			},
		},
		{
			Name: "ggm+failsafe-limiter", Desc: "ggm-retry, plus failsafe-go v0.9.8 adaptivelimiter.NewWithDefaults() as payment's unary server interceptor (failsafegrpc)",
			build: func(*env) (testsvc.Config, error) {
				return testsvc.Config{
					DialOptions: func(hop int) []grpc.DialOption { return []grpc.DialOption{ggm(hop)} },
					ServerOptions: func(tier int) []grpc.ServerOption {
						if tier != 2 {
							return nil
						}
						return []grpc.ServerOption{grpc.ChainUnaryInterceptor(failsafegrpc.NewUnaryServerInterceptor[any](adaptivelimiter.NewWithDefaults[any]()))}
					},
				}, nil
			},
		},
		{
			Name: "stormguard-recommended", Streams: true,
			Desc:  "interceptor.Recommended() on every hop and every tier's server (adaptive throttle and budget on the clients, WithAdmission(admission.Config{}) on the servers), " + timeouts,
			build: slowRecommended(p),
		},
		{
			Name: "stormguard+admission", Streams: true, HasBreaker: true,
			Desc:  "WithBudget(budget.Config{}) and WithBreaker on every hop, " + timeouts + ", and WithAdmission(admission.Config{}) on every tier's server",
			build: slowStormguard(p, admission.Config{}),
		},
		{
			Name: "stormguard+admission+queue", Streams: true, HasBreaker: true, Desc: slowQueueDesc(),
			build: slowStormguard(p, SlowQueue),
		},
	}
}

// SlowSlice is one time slice of the slow-dependency scenario.
type SlowSlice struct {
	From     time.Duration
	Samples  Samples // user requests that started in the slice
	Payment  int64   // calls that reached payment in the slice
	Served   int64   // calls payment's workers finished in the slice
	Succeded int     // user requests that succeeded in the slice (by end)
}

// Slow is the slow-dependency scenario for one stack.
type Slow struct {
	Slices []SlowSlice
	// SlowAt and BackAt are when the slowdown started and ended.
	SlowAt, BackAt time.Duration
	// Goodput is the user requests that succeeded during the slowdown
	// over what payment could serve in it (Workers x SlowFor /
	// SlowService).
	Goodput float64
	// After is the success of the requests that started in the first
	// second after the slowdown.
	After Samples
	// Last is the success of the requests that started in the last
	// second of the run.
	Last  Samples
	Opens [3]int64
}

// Recovery returns the time from the end of the slowdown to the start of
// the first slice that begins a second (or the rest of the run, if
// shorter) of slices with >= 95 % success each, or -1.
func (s Slow) Recovery() time.Duration {
	for i, sl := range s.Slices {
		if sl.From < s.BackAt {
			continue
		}
		good := true
		for _, x := range s.Slices[i:] {
			if x.From >= sl.From+time.Second {
				break
			}
			if len(x.Samples) == 0 || x.Samples.Success() < 0.95 {
				good = false
				break
			}
		}
		if good {
			return sl.From - s.BackAt
		}
	}
	return -1
}

// RunSlow runs the slow-dependency scenario for stack.
func RunSlow(stack Stack, p SlowParams) (Slow, error) {
	inst, err := stack.New(nil, p.Seed)
	if err != nil {
		return Slow{}, err
	}
	c, err := testsvc.Start(inst.Config)
	if err != nil {
		return Slow{}, err
	}
	defer c.Close()
	pay := c.Tier("payment")
	pay.SetPool(testsvc.Pool{Workers: p.Workers, Service: p.Service})
	defer pay.StopPool()
	if err := warm(c); err != nil {
		return Slow{}, err
	}
	slowAt, backAt := p.SlowBefore, p.SlowBefore+p.SlowFor
	total := backAt + p.SlowAfter
	n := int((total + p.Slice - 1) / p.Slice)
	received, served := make([]int64, n+1), make([]int64, n+1)
	phase, next := 0, 0
	s := OpenLoop(c, p.Rate, total, p.Deadline, func(elapsed time.Duration) {
		for next <= n && elapsed >= time.Duration(next)*p.Slice {
			received[next], served[next] = unary(pay), pay.Served()
			next++
		}
		switch {
		case phase == 0 && elapsed >= slowAt:
			pay.SetService(p.SlowService)
			phase = 1
		case phase == 1 && elapsed >= backAt:
			pay.SetService(p.Service)
			phase = 2
		}
	})
	for ; next <= n; next++ {
		received[next], served[next] = unary(pay), pay.Served()
	}
	r := Slow{SlowAt: slowAt, BackAt: backAt, Opens: inst.BreakerOpens()}
	for i := range n {
		from := time.Duration(i) * p.Slice
		sl := SlowSlice{From: from, Samples: s.Between(from, from+p.Slice), Payment: received[i+1] - received[i], Served: served[i+1] - served[i]}
		for _, x := range s {
			if end := x.Start + x.Latency; x.Code == codes.OK && end >= from && end < from+p.Slice {
				sl.Succeded++
			}
		}
		r.Slices = append(r.Slices, sl)
	}
	ok := 0
	for _, x := range s {
		if end := x.Start + x.Latency; x.Code == codes.OK && end >= slowAt && end < backAt {
			ok++
		}
	}
	r.Goodput = float64(ok) / (float64(p.Workers) * p.SlowFor.Seconds() / p.SlowService.Seconds())
	r.After = s.Between(backAt, backAt+time.Second)
	r.Last = s.Between(total-time.Second, total)
	return r, nil
}
