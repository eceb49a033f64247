package bench

import (
	"fmt"
	"time"

	"github.com/failsafe-go/failsafe-go"
	fsbudget "github.com/failsafe-go/failsafe-go/budget"
	"github.com/failsafe-go/failsafe-go/failsafegrpc"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/loadgen"
	"github.com/stormguard/stormguard/internal/testsvc"
)

// TailParams sizes the slow-tail scenario: open-loop arrivals at Rate
// per second for Duration; payment waits Base per request, and a share
// Share of its answers, at random, Slow instead; users wait Deadline.
// Replicas > 1 runs payment as that many replicas behind round_robin,
// the first of them waiting SlowReplica per request (and no tail).
type TailParams struct {
	Seed        uint64
	Rate        int
	Duration    time.Duration
	Base        time.Duration
	Share       float64
	Slow        time.Duration
	Replicas    int
	SlowReplica time.Duration
	Deadline    time.Duration
	Slice       time.Duration
}

// DefaultTailParams: 400 req/s (the in-process chain serves several
// thousand: well under half its capacity); payment waits 2 ms, 2 % of
// its answers 50 times as long (100 ms).
var DefaultTailParams = TailParams{
	Seed:     42,
	Rate:     400,
	Duration: 10 * time.Second,
	Base:     2 * time.Millisecond,
	Share:    0.02,
	Slow:     100 * time.Millisecond,
	Deadline: time.Second,
	Slice:    time.Second,
}

// TailStacks are the stacks of the slow-tail scenario: retries only
// (Recommended), stormguard's hedging at the edge and on every hop,
// failsafe-go's hedge policy at the edge and on every hop (a naive hedge
// per hop).
func TailStacks() []Stack {
	edge := func(hop int) bool { return hop == 0 }
	every := func(int) bool { return true }
	return []Stack{
		{
			Name: "recommended", Stormguard: true,
			Desc:  "interceptor.Recommended() on every tier and hop: retries, no hedges",
			build: func(e *env) (testsvc.Config, error) { return hedgingConfig(e, func(int) bool { return false }) },
		},
		{
			Name: "hedge-edge", Stormguard: true,
			Desc:  "recommended, plus interceptor.WithHedging(interceptor.Hedging{}) on the edge client: one hedge after the 95th percentile of the recent first attempts (50 ms until 100 of them), within the retry budget",
			build: func(e *env) (testsvc.Config, error) { return hedgingConfig(e, edge) },
		},
		{
			Name: "hedge-every-hop", Stormguard: true,
			Desc:  "recommended, plus interceptor.WithHedging(interceptor.Hedging{}) on every hop: the edge hedges, the tiers below see its mark and do not",
			build: func(e *env) (testsvc.Config, error) { return hedgingConfig(e, every) },
		},
		{
			Name:  "failsafe-hedge-edge",
			Desc:  "failsafe-go v0.9.8 hedgepolicy.NewBuilderWithDelayQuantile(0.95, 1000, 100) with budget.New() (failsafegrpc) on the edge client only, no retries",
			build: func(*env) (testsvc.Config, error) { return failsafeHedgeConfig(edge), nil },
		},
		{
			Name:  "failsafe-hedge-every-hop",
			Desc:  "the same failsafe-go hedge policy on every hop: a naive hedge per hop",
			build: func(*env) (testsvc.Config, error) { return failsafeHedgeConfig(every), nil },
		},
	}
}

// hedgingConfig is recommended on every tier, with WithHedging on the
// hops for which hedges reports true.
func hedgingConfig(e *env, hedges func(hop int) bool) (testsvc.Config, error) {
	sg := make([]*interceptor.Interceptors, e.tiers+1) // sg[hop]: hop h is the client inside tier h-1
	for hop := range sg {
		opts := interceptor.Recommended()
		if hedges(hop) {
			opts = append(opts, interceptor.WithHedging(interceptor.Hedging{}))
		}
		var err error
		if sg[hop], err = interceptor.New(e.withObserver(hop-1, opts...)...); err != nil {
			return testsvc.Config{}, err
		}
	}
	return testsvc.Config{
		DialOptions:   func(hop int) []grpc.DialOption { return sg[hop].DialOptions() },
		ServerOptions: func(tier int) []grpc.ServerOption { return sg[tier+1].ServerOptions() },
	}, nil
}

// failsafeHedgeConfig puts failsafe-go's hedge policy, with its budget,
// on the hops for which hedges reports true.
func failsafeHedgeConfig(hedges func(hop int) bool) testsvc.Config {
	return testsvc.Config{DialOptions: func(hop int) []grpc.DialOption {
		if !hedges(hop) {
			return nil
		}
		hp := hedgepolicy.NewBuilderWithDelayQuantile[any](0.95, 1000, 100).WithBudget(fsbudget.New()).Build()
		ex := failsafe.With[any](hp)
		return []grpc.DialOption{grpc.WithChainUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptorWithExecutor(ex))}
	}}
}

// Tail is the slow-tail scenario for one stack.
type Tail struct {
	Samples Samples
	Slices  []loadgen.Slice // calls: at payment (all replicas)
	// Calls are the calls that reached payment (all replicas), Requests
	// the user requests.
	Calls, Requests int64
	// SlowCalls are the calls that reached the slow replica.
	SlowCalls int64
}

// PerRequest returns the calls at payment per user request.
func (t Tail) PerRequest() float64 { return float64(t.Calls) / float64(max(t.Requests, 1)) }

// RunTail runs the slow-tail scenario (or, with p.Replicas > 1, the slow
// replica) for stack, after a warm-up that connects every hop.
func RunTail(stack Stack, p TailParams) (Tail, error) {
	inst, err := stack.Instance(InstanceOptions{Seed: p.Seed, RoundRobin: p.Replicas > 1})
	if err != nil {
		return Tail{}, err
	}
	inst.Config.Replicas = p.Replicas
	c, err := testsvc.Start(inst.Config)
	if err != nil {
		return Tail{}, err
	}
	defer c.Close()
	if err := warm(c); err != nil {
		return Tail{}, err
	}
	pays := c.Replicas("payment")
	for _, r := range pays {
		r.SetLatency(p.Base)
		if p.Replicas <= 1 {
			r.SetTail(p.Share, p.Slow)
		}
	}
	if p.Replicas > 1 {
		pays[0].SetLatency(p.SlowReplica)
	}
	calls := func() int64 {
		var n int64
		for _, r := range pays {
			n += unary(r)
		}
		return n
	}
	s, slices := loadgen.Sliced(c, p.Rate, p.Duration, p.Deadline, p.Slice, calls, nil)
	t := Tail{Samples: s, Slices: slices, Calls: calls(), Requests: int64(len(s))}
	if p.Replicas > 1 {
		t.SlowCalls = unary(pays[0])
	}
	if len(s) == 0 {
		return t, fmt.Errorf("stack %s: no requests", stack.Name)
	}
	return t, nil
}

// HedgeBusyParams sizes the busy scenarios of hedging: payment serves
// from Workers workers at Service per call, with a FIFO queue that
// ignores cancellation (capacity Workers/Service); Users callers at a
// fixed concurrency for Duration, or open-loop arrivals at Factor times
// the capacity for Duration and then at half the capacity for After;
// users wait Deadline.
type HedgeBusyParams struct {
	Seed     uint64
	Workers  int
	Service  time.Duration
	Users    int
	Factor   float64
	Duration time.Duration
	After    time.Duration
	Deadline time.Duration
}

// DefaultHedgeBusyParams: 4 workers at 5 ms (800/s); 32 callers, or
// 2x (1 600/s) open-loop for 3 s.
var DefaultHedgeBusyParams = HedgeBusyParams{
	Seed:     42,
	Workers:  4,
	Service:  5 * time.Millisecond,
	Users:    32,
	Factor:   2,
	Duration: 3 * time.Second,
	After:    2 * time.Second,
	Deadline: time.Second,
}

// Capacity returns payment's capacity in calls per second.
func (p HedgeBusyParams) Capacity() float64 { return float64(p.Workers) / p.Service.Seconds() }

// HedgeBusy is one busy run: what the users saw (during the load, and
// for the open loop after it), the calls payment's workers served, and
// how long the load ran.
type HedgeBusy struct {
	Samples, After Samples
	Served         int64
	Calls          int64
	Took           time.Duration
}

// Goodput returns the successful user requests per second during the
// load.
func (h HedgeBusy) Goodput() float64 {
	ok := 0
	for _, s := range h.Samples {
		if s.Code == codes.OK {
			ok++
		}
	}
	return float64(ok) / h.Took.Seconds()
}

// RunHedgeBusy runs the fixed-concurrency (open false) or the open-loop
// busy scenario for stack.
func RunHedgeBusy(stack Stack, p HedgeBusyParams, open bool) (HedgeBusy, error) {
	c, _, err := start(stack, p.Seed)
	if err != nil {
		return HedgeBusy{}, err
	}
	defer c.Close()
	pay := c.Tier("payment")
	pay.SetPool(testsvc.Pool{Workers: p.Workers, Service: p.Service})
	defer pay.StopPool()
	pay.ResetCounts()
	var r HedgeBusy
	began := time.Now()
	if !open {
		r.Samples = loadgen.FixedConcurrency(c, p.Users, p.Duration, p.Deadline, 10*time.Millisecond, nil)
		r.Took = time.Since(began)
	} else {
		rate := int(p.Factor * p.Capacity())
		rates := []loadgen.Rate{{PerSecond: rate}, {From: p.Duration, PerSecond: int(p.Capacity() / 2)}}
		s := loadgen.OpenLoopRates(c, rates, p.Duration+p.After, p.Deadline, nil)
		r.Samples, r.After, r.Took = s.Between(0, p.Duration), s.Between(p.Duration, p.Duration+p.After), p.Duration
	}
	r.Served, r.Calls = pay.Served(), unary(pay)
	return r, nil
}
