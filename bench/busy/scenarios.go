package busy

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/stormguard/stormguard/bench"
)

// Params size the scenarios of issue 19.
type Params struct {
	// 1. Healthy at capacity: payment burns CPU per request (CPUUnits,
	// calibrated to CPU); CapCallers fixed-concurrency callers for
	// CapLength, for each of CapVariants.
	CPU         time.Duration
	CPUUnits    int64
	CapCallers  []int
	CapVariants []CapVariant
	CapLength   time.Duration
	CapStacks   []string

	// 2. Slow but healthy tiers: SlowVariants, SlowCallers, SlowLength.
	SlowVariants []SlowVariant
	SlowCallers  []int
	SlowLength   time.Duration
	SlowStacks   []string

	// 3. Replicas: three payments behind round_robin, one of them bad;
	// ReplicaCallers callers for ReplicaLength, each with ReplicaDeadline;
	// slices of ReplicaSlice.
	Replica         Work // a good replica
	Replicas        []ReplicaVariant
	ReplicaCallers  int
	ReplicaLength   time.Duration
	ReplicaDeadline time.Duration
	ReplicaSlice    time.Duration
	ReplicaStacks   []string

	// 4. Real overload. Capacity: the goodput of retries off at its
	// best of PoolCallers fixed concurrencies (CapacityLength per run,
	// CapacityDeadline per request) with a worker-pool payment (Pool).
	// Then open-loop arrivals at OverAfterFraction x capacity for
	// OverBefore (the healthy traffic an overload meets: a spike hits a
	// service that was serving), at each of OverFactors x capacity for
	// OverFor and OverAfterFraction x capacity for OverAfter, every
	// request with OverDeadline, on OverStacks; "after" is the success
	// of the requests started in the RecoveryWithin after the overload;
	// slices of OverSlice. 4b: the same with a CPU-bound payment
	// (CPUUnits) at CPUCallers, CPUFactors and CPUStacks (report only).
	// AtLeastNominal makes the factors of a worker-pool payment (4 and
	// 6) scale at least the pool's nominal capacity, Workers/Hold (the
	// measurement still runs and is shown): a test beside other
	// packages' tests on 2 cores measured a quarter of its pool's
	// capacity, and "4x" of that was served in full, no overload.
	Pool              Work
	AtLeastNominal    bool
	PoolCallers       []int
	OverFactors       []float64
	OverStacks        []string
	CPUCallers        []int
	CPUFactors        []float64
	CPUStacks         []string
	CapacityLength    time.Duration
	CapacityDeadline  time.Duration
	OverBefore        time.Duration
	OverFor           time.Duration
	OverAfter         time.Duration
	OverAfterFraction float64
	OverDeadline      time.Duration
	RecoveryWithin    time.Duration
	OverSlice         time.Duration

	// 5. An outage after healthy traffic: payment doing Outage (a
	// worker pool, so that the machine is not saturated while it is
	// healthy), for each of OutageCases, every request with
	// OutageDeadline: payment healthy for OutageBefore from the load's
	// start, out for OutageFor, healthy again for OutageAfter (the load
	// ends a moment after); per slice of OutageSlice from OutageShown
	// before the outage to OutageAfter after it.
	Outage         Work
	OutageCases    []OutageCase
	OutageBefore   time.Duration
	OutageFor      time.Duration
	OutageAfter    time.Duration
	OutageShown    time.Duration
	OutageSlice    time.Duration
	OutageDeadline time.Duration

	// 6. Latency that spreads (each request's time drawn from an
	// exponential distribution, as a dependency's or a database's
	// spreads). overload-spread: the overload of 4 (its phases and
	// deadline) with a worker-pool payment whose hold spreads
	// (SpreadPool), capacity at SpreadCallers, at SpreadFactors.
	// start-spread: payment waits StartWork (spread, no pool: a server
	// that never queues, and the tiers above it wait on it), and
	// open-loop arrivals at StartRate begin right after the warm-up (a
	// new replica, a deploy) for StartFor, each request with
	// StartDeadline; slices of StartSlice.
	SpreadPool    Work
	SpreadCallers []int
	SpreadFactors []float64
	SpreadStacks  []string
	StartWork     Work
	StartRate     float64
	StartFor      time.Duration
	StartDeadline time.Duration
	StartSlice    time.Duration
	StartStacks   []string

	// 7. A load test that ramps up: payment a worker pool (RampWork),
	// the fixed-concurrency load's callers started as Ramp says, up to
	// each of RampCallers, for RampLength, each request with each of
	// RampDeadlines in turn; slices of RampSlice. Healthy: every
	// refusal is one too many.
	RampWork      Work
	Ramp          Ramp
	RampCallers   []int
	RampLength    time.Duration
	RampDeadlines []time.Duration
	RampSlice     time.Duration
	RampStacks    []string

	// 8. Slow requests next to fast ones: payment waits MixWork (Wait
	// for a fast request, about SlowWait for a slow one; no pool: it
	// never queues), the tiers above wait on it. Open-loop arrivals of
	// MixFast fast requests a second for MixBefore, MixSlow slow ones a
	// second on top for MixFor (payment's share of slow requests
	// switched to MixSlow / (MixFast + MixSlow) meanwhile: a report or
	// a batch starts), then MixFast again for MixAfter; every request
	// with MixDeadline; slices of MixSlice. Healthy: every refusal is
	// one too many.
	MixWork     Work
	MixFast     float64
	MixSlow     float64
	MixBefore   time.Duration
	MixFor      time.Duration
	MixAfter    time.Duration
	MixDeadline time.Duration
	MixSlice    time.Duration
	MixStacks   []string
}

// CapVariant is one table of scenario 1: payment's random failures and
// the requests' deadline (0: none).
type CapVariant struct {
	Fail     float64
	Deadline time.Duration
}

// SlowVariant is one table of scenario 2.
type SlowVariant struct {
	Name string
	// Gateway, Order and Payment wait this long per request.
	Gateway, Order, Payment time.Duration
	Deadline                time.Duration // 0: none
}

// ReplicaVariant is one case of scenario 3: the bad replica's work.
type ReplicaVariant struct {
	Name string
	Bad  Work
}

// peers are the best of the other stacks: go-grpc-middleware's retry,
// grpc-go's built-in retry and failsafe-go's retry with its budget.
var peers = []string{"ggm-retry", "grpc-retry", "failsafe-budget"}

// withStacks lists none, the recommended stacks and the peers.
func withStacks(health bool) []string {
	s := []string{baseline, "recommended"}
	if health {
		s = append(s, "recommended-health")
	}
	return append(s, peers...)
}

// DefaultParams are the sizes of `make bench-busy`: every scenario of
// issue 19 in about 30 minutes on 2 cores (the outage's 45 runs of
// 6.5 s are 5 of them). The CPU-bound overload stops
// at 2x: on 2 cores the open-loop generator, which shares them, cannot
// send much more than that (it reports the rate it reached).
var DefaultParams = Params{
	CPU:        200 * time.Microsecond,
	CapCallers: []int{8, 32, 128, 512},
	CapVariants: []CapVariant{
		{Fail: 0, Deadline: 0},
		{Fail: 0, Deadline: 2 * time.Second},
		{Fail: 0.01, Deadline: 2 * time.Second},
		{Fail: 0.10, Deadline: 2 * time.Second},
	},
	CapLength: 1250 * time.Millisecond,
	CapStacks: withStacks(true),

	SlowVariants: []SlowVariant{
		{Name: "gateway and order wait 30 ms", Gateway: 30 * time.Millisecond, Order: 30 * time.Millisecond, Deadline: 200 * time.Millisecond},
		{Name: "gateway and order wait 30 ms", Gateway: 30 * time.Millisecond, Order: 30 * time.Millisecond},
		{Name: "payment waits 20 ms", Payment: 20 * time.Millisecond, Deadline: 60 * time.Millisecond},
		{Name: "payment waits 20 ms", Payment: 20 * time.Millisecond},
	},
	SlowCallers: []int{128, 512},
	SlowLength:  1250 * time.Millisecond,
	SlowStacks:  withStacks(false),

	Replica: Work{Workers: 10, Hold: 2 * time.Millisecond},
	Replicas: []ReplicaVariant{
		{Name: "one alive but failing everything", Bad: Work{FailAll: true}},
		{Name: "one waiting 10x longer per request (100 workers x 20 ms: same capacity)", Bad: Work{Workers: 100, Hold: 20 * time.Millisecond}},
		{Name: "one at a fifth of the capacity (2 workers x 2 ms)", Bad: Work{Workers: 2, Hold: 2 * time.Millisecond}},
	},
	ReplicaCallers:  128,
	ReplicaLength:   3 * time.Second,
	ReplicaDeadline: time.Second,
	ReplicaSlice:    500 * time.Millisecond,
	ReplicaStacks:   withStacks(true),

	Pool:              Work{Workers: 4, Hold: 5 * time.Millisecond},
	PoolCallers:       []int{4, 8, 32},
	OverFactors:       []float64{1.5, 2, 4, 8},
	CPUCallers:        []int{32, 128},
	CPUFactors:        []float64{1.5, 2},
	OverBefore:        time.Second,
	OverFor:           5 * time.Second,
	OverAfter:         1200 * time.Millisecond,
	OverDeadline:      time.Second,
	OverSlice:         time.Second,
	CapacityLength:    2 * time.Second,
	CapacityDeadline:  time.Second,
	OverStacks:        withStacks(true),
	CPUStacks:         withStacks(false),
	RecoveryWithin:    time.Second,
	OverAfterFraction: 0.5,

	// 128 callers with every stack; 32 with stormguard's only, to keep
	// the scenario near 5 minutes (each run is 6.5 s).
	Outage: Work{Workers: 8, Hold: 5 * time.Millisecond},
	OutageCases: []OutageCase{
		{Name: "fail-all", Desc: failAllDesc, Callers: 128, Stacks: withStacks(true)},
		{Name: "kill", Desc: killDesc, Kill: true, Callers: 128, Stacks: withStacks(true)},
		{Name: "fail-all", Desc: failAllDesc, Callers: 32, Stacks: []string{baseline, "recommended", "recommended-health"}},
	},
	OutageBefore:   2 * time.Second,
	OutageFor:      2 * time.Second,
	OutageAfter:    2 * time.Second,
	OutageShown:    time.Second,
	OutageSlice:    500 * time.Millisecond,
	OutageDeadline: time.Second,

	SpreadPool:    Work{Workers: 16, Hold: 50 * time.Millisecond, Spread: true},
	SpreadCallers: []int{16, 32, 64},
	SpreadFactors: []float64{2},
	SpreadStacks:  []string{baseline, "recommended", "recommended-health"},
	StartWork:     Work{Wait: 100 * time.Millisecond, Spread: true},
	StartRate:     400,
	StartFor:      6 * time.Second,
	StartDeadline: time.Second,
	StartSlice:    500 * time.Millisecond,
	StartStacks:   []string{baseline, "recommended", "recommended-health"},

	// 700 ok/s; 16 callers, then 8 more every 25 ms: 512 in 1.55 s, 1 024
	// in 3.1 s (ghz --concurrency-schedule step). Without a deadline
	// (ghz --timeout 0) and with ghz's default of 20 s.
	RampWork:      Work{Workers: 4, Hold: 5 * time.Millisecond},
	Ramp:          Ramp{Start: 16, Step: 8, Every: 25 * time.Millisecond},
	RampCallers:   []int{128, 512, 1024},
	RampLength:    4 * time.Second,
	RampDeadlines: []time.Duration{0, 20 * time.Second},
	RampSlice:     500 * time.Millisecond,
	RampStacks:    withStacks(true),

	// The review grid's slow mix (admission/testdata/review): about 40
	// slow requests in flight, at most 300 ms each.
	MixWork:     Work{Wait: 4500 * time.Microsecond, SlowWait: 200 * time.Millisecond},
	MixFast:     50,
	MixSlow:     192,
	MixBefore:   2 * time.Second,
	MixFor:      4 * time.Second,
	MixAfter:    1500 * time.Millisecond,
	MixDeadline: 2 * time.Second,
	MixSlice:    500 * time.Millisecond,
	MixStacks:   []string{baseline, "recommended", "recommended-health"},
}

// The descriptions of the outage cases.
const (
	failAllDesc = "payment alive but failing everything (UNAVAILABLE)"
	killDesc    = "payment's process killed (SIGKILL), restarted on the same port"
)

// Quick returns p cut down for a look in a few minutes: the smallest
// and largest caller counts, one deadline variant each, shorter loads.
func Quick(p Params) Params {
	p.CapCallers = []int{32, 512}
	p.CapVariants = []CapVariant{{Fail: 0, Deadline: 0}, {Fail: 0.10, Deadline: 2 * time.Second}}
	p.CapLength = time.Second
	p.SlowVariants = []SlowVariant{p.SlowVariants[0], p.SlowVariants[2]}
	p.SlowCallers = []int{128}
	p.SlowLength = time.Second
	p.ReplicaLength = 2 * time.Second
	p.PoolCallers = []int{8}
	p.OverFactors = []float64{8}
	p.CPUCallers = []int{32}
	p.CPUFactors = []float64{2}
	p.OverFor = 5 * time.Second
	p.OverAfter = 1500 * time.Millisecond
	p.CapacityLength = time.Second
	p.OutageCases = p.OutageCases[:2] // 128 callers, fail-all and kill
	p.RampCallers = []int{512}
	return p
}

// Scenarios are the scenario names, for the filter.
var Scenarios = []string{"capacity", "slow", "replicas", "overload", "overload-cpu", "outage", "overload-spread", "start-spread", "ramp", "mix"}

// Run runs the scenarios whose name matches only.
func (h *Harness) Run(ctx context.Context, only *regexp.Regexp) error {
	for _, sc := range []struct {
		name string
		run  func(context.Context) error
	}{
		{"capacity", h.capacity},
		{"slow", h.slow},
		{"replicas", h.replicas},
		{"overload", func(ctx context.Context) error { return h.overload(ctx, overloadPool) }},
		{"overload-cpu", func(ctx context.Context) error { return h.overload(ctx, overloadCPU) }},
		{"outage", h.outage},
		{"overload-spread", func(ctx context.Context) error { return h.overload(ctx, overloadSpread) }},
		{"start-spread", h.startSpread},
		{"ramp", h.ramp},
		{"mix", h.mix},
	} {
		if only == nil || only.MatchString(sc.name) {
			if err := sc.run(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// fixed returns the drive of a fixed-concurrency run.
func (h *Harness) fixed(callers int, length, deadline time.Duration) drive {
	return func(ctx context.Context, c *Chain) (Result, error) {
		return h.Load.Fixed(ctx, c.Addr(), callers, length, deadline)
	}
}

// fixedHead is the head of the fixed-concurrency tables.
var fixedHead = []string{"callers", "stack", "success", "goodput (ok/s): median (range)", "vs none", "p99", "p99 of successes", "refusals", "downs", "calls at payment / request", "tiers' CPU / request", "vs none"}

func fixedRow(t *table, callers int, stack string, f, none Figures) {
	t.row(callers, stack, pct2(f.Success), goodput(f), ratio(f.Goodput, none.Goodput),
		ms(f.P99), ms(f.P99OK), refusals(f), downs(f), fmt.Sprintf("%.3f", f.PaymentPerRequest),
		fmt.Sprintf("%.0f µs", float64(f.TierCPU)/float64(time.Microsecond)), ratio(float64(f.TierCPU), float64(none.TierCPU)))
}

// capacity is scenario 1: a healthy chain at capacity, payment burning
// CPU so that the machine is saturated.
func (h *Harness) capacity(ctx context.Context) error {
	p := h.Params
	stacks := h.stacks(p.CapStacks)
	fmt.Fprintf(h.Out, "## 1. Healthy at capacity\n\n"+
		"Payment burns %v of CPU per request (%d units of busy loop, calibrated once); gateway and order forward. "+
		"%s at a fixed concurrency (each caller sends its next request the moment an answer comes) for %v per run; "+
		"each figure the median of %d interleaved runs.\n\n", p.CPU, p.CPUUnits, h.Load.Name(), p.CapLength, h.Runs)
	for _, v := range p.CapVariants {
		t := newTable(fixedHead...)
		for _, n := range p.CapCallers {
			name := fmt.Sprintf("capacity, fail %.0f %%, %s, %d callers", 100*v.Fail, deadline(v.Deadline), n)
			spec := func(string) ChainSpec {
				return ChainSpec{Payments: []Work{{CPU: p.CPUUnits, Fail: v.Fail}}}
			}
			runs, err := h.runCase(ctx, name, stacks, spec, h.fixed(n, p.CapLength, v.Deadline))
			if err != nil {
				return err
			}
			med := medianFigures(runs, 0, 0)
			for _, s := range stacks {
				fixedRow(t, n, s, med[s], med[baseline])
			}
		}
		state := "healthy"
		if v.Fail > 0 {
			state = fmt.Sprintf("payment fails %.0f %% at random (UNAVAILABLE)", 100*v.Fail)
		}
		fmt.Fprintf(h.Out, "### 1. At capacity: %s, %s\n\n", state, deadline(v.Deadline))
		t.write(h.Out)
	}
	return nil
}

// slow is scenario 2: slow but healthy tiers (waiting, not CPU).
func (h *Harness) slow(ctx context.Context) error {
	p := h.Params
	stacks := h.stacks(p.SlowStacks)
	fmt.Fprintf(h.Out, "## 2. Slow but healthy\n\n"+
		"Tiers wait (sleep) per request; nothing fails. %s at a fixed concurrency for %v per run; median of %d interleaved runs.\n\n",
		h.Load.Name(), p.SlowLength, h.Runs)
	for _, v := range p.SlowVariants {
		t := newTable(fixedHead...)
		for _, n := range p.SlowCallers {
			name := fmt.Sprintf("slow, %s, %s, %d callers", v.Name, deadline(v.Deadline), n)
			spec := func(string) ChainSpec {
				return ChainSpec{Gateway: Work{Wait: v.Gateway}, Order: Work{Wait: v.Order}, Payments: []Work{{Wait: v.Payment}}}
			}
			runs, err := h.runCase(ctx, name, stacks, spec, h.fixed(n, p.SlowLength, v.Deadline))
			if err != nil {
				return err
			}
			med := medianFigures(runs, 0, 0)
			for _, s := range stacks {
				fixedRow(t, n, s, med[s], med[baseline])
			}
		}
		fmt.Fprintf(h.Out, "### 2. Slow: %s, %s\n\n", v.Name, deadline(v.Deadline))
		t.write(h.Out)
	}
	return nil
}

// replicas is scenario 3: payment as three replicas behind round_robin,
// one of them bad.
func (h *Harness) replicas(ctx context.Context) error {
	p := h.Params
	stacks := h.stacks(p.ReplicaStacks)
	fmt.Fprintf(h.Out, "## 3. Replicas\n\n"+
		"Payment as 3 processes behind order's round_robin; a good replica serves from %d workers holding one for %v each. "+
		"%s, %d callers at a fixed concurrency for %v per run, %s; median of %d interleaved runs. "+
		"\"After 1 s\": the requests that started after the first second. \"Bad replica\": its share of the calls that reached payment.\n\n",
		p.Replica.Workers, p.Replica.Hold, h.Load.Name(), p.ReplicaCallers, p.ReplicaLength, deadline(p.ReplicaDeadline), h.Runs)
	for _, v := range p.Replicas {
		name := "replicas, " + v.Name
		spec := func(string) ChainSpec { return ChainSpec{Payments: []Work{v.Bad, p.Replica, p.Replica}} }
		runs, err := h.runCase(ctx, name, stacks, spec, h.fixed(p.ReplicaCallers, p.ReplicaLength, p.ReplicaDeadline))
		if err != nil {
			return err
		}
		all := medianFigures(runs, 0, 0)
		after := medianFigures(runs, time.Second, 0)
		t := newTable("stack", "success", "after 1 s", "goodput (ok/s): median (range)", "vs none", "p99", "refusals", "downs", "calls at payment / request", "bad replica")
		for _, s := range stacks {
			f := all[s]
			t.row(s, pct2(f.Success), pct2(after[s].Success), goodput(f), ratio(f.Goodput, all[baseline].Goodput),
				ms(f.P99), refusals(f), downs(f), fmt.Sprintf("%.3f", f.PaymentPerRequest), pct(badShare(runs[s])))
		}
		fmt.Fprintf(h.Out, "### 3. Replicas: %s\n\n", v.Name)
		t.write(h.Out)
		h.sliceTable(stacks, medianSlicesOf(runs, p.ReplicaSlice), p.ReplicaSlice, 0, "success", func(sl Slice) string { return pct(sl.Success) })
	}
	return nil
}

// badShare returns the median over runs of the bad replica's (the
// first's) share of the calls at payment.
func badShare(runs []Run) float64 {
	var v []float64
	for _, r := range runs {
		var all int64
		pays := r.Counts.Payment()
		for _, c := range pays {
			all += c.Received
		}
		if all > 0 {
			v = append(v, float64(pays[0].Received)/float64(all))
		}
	}
	if len(v) == 0 {
		return -1
	}
	return medianOf(v)
}

// sliceTable prints one row per stack, one column per slice, cell(slice)
// in each.
func (h *Harness) sliceTable(stacks []string, sl map[string][]Slice, width, mark time.Duration, what string, cell func(Slice) string) {
	head := []string{"stack"}
	for _, x := range sl[baseline] {
		label := fmt.Sprintf("%v-%v", x.From.Round(time.Millisecond), (x.From + width).Round(time.Millisecond))
		if mark > 0 && x.From == mark {
			label += " (after)"
		}
		head = append(head, label)
	}
	t := newTable(head...)
	for _, s := range stacks {
		r := []any{s}
		for _, x := range sl[s] {
			r = append(r, cell(x))
		}
		t.row(r...)
	}
	fmt.Fprintf(h.Out, "Per slice of %v (success by request start, goodput by answer), %s:\n\n", width, what)
	t.write(h.Out)
}

// The payments of the overload scenarios.
const (
	overloadPool   = iota // 4: a worker pool
	overloadCPU           // 4b: CPU-bound
	overloadSpread        // 6: a worker pool whose hold spreads
)

// overload is scenario 4: open-loop arrivals beyond the chain's
// capacity, then below it, with the payment of kind: a worker pool, a
// CPU-bound one (report only: 2 cores bound what any shedder can keep),
// or a worker pool whose hold spreads (6).
func (h *Harness) overload(ctx context.Context, kind int) error {
	p := h.Params
	stacks := h.stacks(p.OverStacks)
	pay, callers, factors := p.Pool, p.PoolCallers, p.OverFactors
	title := fmt.Sprintf("## 4. Real overload: worker-pool payment (%d workers, each request holds one for %v)\n\n", p.Pool.Workers, p.Pool.Hold)
	suffix := ""
	switch kind {
	case overloadCPU:
		pay, callers, factors = Work{CPU: p.CPUUnits}, p.CPUCallers, p.CPUFactors
		stacks = h.stacks(p.CPUStacks)
		title = fmt.Sprintf("## 4b. Real overload, CPU-bound payment (%v of CPU per request; report only)\n\n", p.CPU)
		suffix = "-cpu"
	case overloadSpread:
		pay, callers, factors = p.SpreadPool, p.SpreadCallers, p.SpreadFactors
		stacks = h.stacks(p.SpreadStacks)
		title = fmt.Sprintf("## 6. Latency that spreads: the overload of 4 with a worker-pool payment (%d workers, each request holds one for %v on average, exponentially distributed)\n\n", pay.Workers, pay.Hold)
		suffix = "-spread"
	}
	spec := func(string) ChainSpec { return ChainSpec{Payments: []Work{pay}} }
	fmt.Fprint(h.Out, title)

	atLeast := 0.0
	if kind != overloadCPU && p.AtLeastNominal && pay.Hold > 0 {
		atLeast = float64(pay.Workers) / pay.Hold.Seconds()
	}
	capacity, err := h.capacityOf(ctx, spec, callers, atLeast)
	if err != nil {
		return err
	}

	fmt.Fprintf(h.Out, "Open-loop arrivals (independent of answers, the project's own generator) at %.1fx of capacity for %v (the healthy traffic the overload meets), at each factor of capacity for %v, then %.1fx for %v; every request %s. "+
		"Overload figures are over the requests that started in the overload (calls at payment: those that reached it in the overload, per request started in it); refusals and downs count the whole run; \"after\" over the requests that started in the first %v after it; median of %d interleaved runs.\n\n",
		p.OverAfterFraction, p.OverBefore, p.OverFor, p.OverAfterFraction, p.OverAfter, deadline(p.OverDeadline), p.RecoveryWithin, h.Runs)
	t := newTable("factor", "stack", "asked (req/s)", "reached (req/s)", "success", "goodput / capacity: median (range)", "p99 of successes", "success after", "refusals", "downs", "calls at payment / request")
	var slices []func()
	for _, fct := range factors {
		calm := p.OverAfterFraction * capacity
		phases := []Phase{{Rate: calm, For: p.OverBefore}, {Rate: fct * capacity, For: p.OverFor}, {Rate: calm, For: p.OverAfter}}
		start, end := p.OverBefore, p.OverBefore+p.OverFor
		d := func(ctx context.Context, c *Chain) (Result, error) {
			res, err := OpenLoop(ctx, c.Addr(), phases, p.OverDeadline, h.OpenConns)
			if err != nil {
				return res, err
			}
			res.Payment, err = c.PaymentArrivals(ctx)
			return res, err
		}
		name := fmt.Sprintf("overload%s %.1fx", suffix, fct)
		runs, err := h.runCase(ctx, name, stacks, spec, d)
		if err != nil {
			return err
		}
		over := medianFigures(runs, start, end)
		after := medianFigures(runs, end, end+p.RecoveryWithin)
		for _, s := range stacks {
			f := over[s]
			t.row(fmt.Sprintf("%.1fx", fct), s, rate(phases[1].Rate), rate(reached(runs[s], 1)), pct2(f.Success),
				ratioRange(f, capacity), ms(f.P99OK), pct2(after[s].Success), refusals(f), downs(f), fmt.Sprintf("%.3f", f.PaymentPerRequest))
		}
		sl := medianSlicesOf(runs, p.OverSlice)
		slices = append(slices, func() {
			fmt.Fprintf(h.Out, "%.1fx: ", fct)
			h.sliceTable(stacks, sl, p.OverSlice, end, "success, goodput / capacity and p99 of successes", func(x Slice) string {
				p99 := "-" // no success
				if x.P99OK > 0 {
					p99 = ms(x.P99OK)
				}
				return fmt.Sprintf("%s, %s, %s", pct(x.Success), ratio(x.Goodput, capacity), p99)
			})
		})
	}
	t.write(h.Out)
	for _, f := range slices {
		f()
	}
	return nil
}

// startSpread is the second case of scenario 6: open-loop traffic meets
// a chain right after its warm-up, payment waiting (never queueing) a
// latency that spreads, the tiers above waiting on it.
func (h *Harness) startSpread(ctx context.Context) error {
	p := h.Params
	stacks := h.stacks(p.StartStacks)
	fmt.Fprintf(h.Out, "## 6b. Latency that spreads: open-loop traffic meets a chain that waits\n\n"+
		"Payment waits %v per request on average (exponentially distributed; no pool: it never queues), gateway and order wait on it. "+
		"Open-loop arrivals at %.0f req/s from right after the warm-up (a new replica, a deploy) for %v, %s; median of %d interleaved runs. "+
		"Nothing is overloaded: every refusal is one too many.\n\n",
		p.StartWork.Wait, p.StartRate, p.StartFor, deadline(p.StartDeadline), h.Runs)
	spec := func(string) ChainSpec { return ChainSpec{Payments: []Work{p.StartWork}} }
	phases := []Phase{{Rate: p.StartRate, For: p.StartFor}}
	d := func(ctx context.Context, c *Chain) (Result, error) {
		return OpenLoop(ctx, c.Addr(), phases, p.StartDeadline, h.OpenConns)
	}
	runs, err := h.runCase(ctx, "start-spread", stacks, spec, d)
	if err != nil {
		return err
	}
	all := medianFigures(runs, 0, p.StartFor)
	later := medianFigures(runs, 2*time.Second, p.StartFor)
	t := newTable("stack", "reached (req/s)", "success", "success from 2 s", "p99 of successes", "refusals", "downs", "calls at payment / request")
	for _, s := range stacks {
		f := all[s]
		t.row(s, rate(reached(runs[s], 0)), pct2(f.Success), pct2(later[s].Success), ms(f.P99OK), refusals(f), downs(f), fmt.Sprintf("%.3f", f.PaymentPerRequest))
	}
	t.write(h.Out)
	h.sliceTable(stacks, medianSlicesOf(runs, p.StartSlice), p.StartSlice, 0, "success", func(sl Slice) string { return pct(sl.Success) })
	return nil
}

// ramp is scenario 7: a load test that ramps its callers up into a
// pool, which looks like an open-loop overload for as long as it ramps.
func (h *Harness) ramp(ctx context.Context) error {
	p := h.Params
	stacks := h.stacks(p.RampStacks)
	fmt.Fprintf(h.Out, "## 7. A load test that ramps up\n\n"+
		"Payment is a pool of %d workers of %v; gateway and order forward. %s at a fixed concurrency whose callers start over time: "+
		"%d at once, then %d more every %v, up to the number of callers (ghz --concurrency-schedule step), for %v per run; "+
		"median of %d interleaved runs. Nothing is overloaded (a closed loop at capacity): every refusal is one too many.\n\n",
		p.RampWork.Workers, p.RampWork.Hold, h.Load.Name(), p.Ramp.Start, p.Ramp.Step, p.Ramp.Every, p.RampLength, h.Runs)
	for _, dl := range p.RampDeadlines {
		t := newTable(fixedHead...)
		var last map[string][]Slice // of the most callers
		for _, n := range p.RampCallers {
			spec := func(string) ChainSpec { return ChainSpec{Payments: []Work{p.RampWork}} }
			d := func(ctx context.Context, c *Chain) (Result, error) {
				return h.Load.Ramped(ctx, c.Addr(), n, p.Ramp, p.RampLength, dl)
			}
			runs, err := h.runCase(ctx, fmt.Sprintf("ramp, %s, %d callers", deadline(dl), n), stacks, spec, d)
			if err != nil {
				return err
			}
			med := medianFigures(runs, 0, 0)
			for _, s := range stacks {
				fixedRow(t, n, s, med[s], med[baseline])
			}
			last = medianSlicesOf(runs, p.RampSlice)
		}
		fmt.Fprintf(h.Out, "### 7. Ramp: %s\n\n", deadline(dl))
		t.write(h.Out)
		n := p.RampCallers[len(p.RampCallers)-1]
		h.sliceTable(stacks, last, p.RampSlice, 0, fmt.Sprintf("success and p99 of successes at %d callers, %s", n, deadline(dl)), func(sl Slice) string {
			return pct(sl.Success) + ", " + ms(sl.P99OK)
		})
	}
	return nil
}

// mix is scenario 8: a healthy chain whose payment, serving fast
// requests, is given slow ones as well; nothing is overloaded.
func (h *Harness) mix(ctx context.Context) error {
	p := h.Params
	stacks := h.stacks(p.MixStacks)
	share := p.MixSlow / (p.MixFast + p.MixSlow)
	fmt.Fprintf(h.Out, "## 8. Slow requests next to fast ones\n\n"+
		"Payment waits %v per request (no pool: it never queues), gateway and order wait on it. "+
		"Open-loop arrivals of %.0f req/s for %v; then %.0f slow requests a second on top for %v "+
		"(a report, a batch: %.0f %% of payment's requests wait between %v and %v), then %.0f req/s for %v; %s; "+
		"median of %d interleaved runs. Nothing is overloaded: every refusal is one too many.\n\n",
		p.MixWork.Wait, p.MixFast, p.MixBefore, p.MixSlow, p.MixFor, 100*share, p.MixWork.SlowWait/2, 3*p.MixWork.SlowWait/2,
		p.MixFast, p.MixAfter, deadline(p.MixDeadline), h.Runs)
	spec := func(string) ChainSpec { return ChainSpec{Payments: []Work{p.MixWork}} }
	phases := []Phase{{Rate: p.MixFast, For: p.MixBefore}, {Rate: p.MixFast + p.MixSlow, For: p.MixFor}, {Rate: p.MixFast, For: p.MixAfter}}
	d := func(ctx context.Context, c *Chain) (Result, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		switched := make(chan error, 1)
		go func() {
			switched <- switchAt(ctx, []time.Duration{p.MixBefore, p.MixBefore + p.MixFor}, []float64{share, 0}, c)
		}()
		res, err := OpenLoop(ctx, c.Addr(), phases, p.MixDeadline, h.OpenConns)
		cancel()
		return res, errors.Join(err, <-switched)
	}
	runs, err := h.runCase(ctx, "mix", stacks, spec, d)
	if err != nil {
		return err
	}
	from, to := p.MixBefore, p.MixBefore+p.MixFor
	all := medianFigures(runs, 0, 0)
	slow := medianFigures(runs, from, to)
	t := newTable("stack", "success", "success with slow requests", "p99 of successes", "p99 with slow requests", "refusals", "downs", "calls at payment / request")
	for _, s := range stacks {
		f := all[s]
		t.row(s, pct2(f.Success), pct2(slow[s].Success), ms(f.P99OK), ms(slow[s].P99OK), refusals(f), downs(f), fmt.Sprintf("%.3f", f.PaymentPerRequest))
	}
	t.write(h.Out)
	h.sliceTable(stacks, medianSlicesOf(runs, p.MixSlice), p.MixSlice, 0, "success and p99 of successes", func(sl Slice) string {
		return fmt.Sprintf("%s, %s", pct(sl.Success), ms(sl.P99OK))
	})
	return nil
}

// switchAt switches payment's share of slow requests to shares[i] at
// each of at[i] from its call, in order; it returns at the last switch,
// or when ctx ends (nil then: the load ended first).
func switchAt(ctx context.Context, at []time.Duration, shares []float64, c *Chain) error {
	t0 := time.Now()
	for i, d := range at {
		t := time.NewTimer(d - time.Since(t0))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if err := c.SlowPayment(ctx, 0, shares[i]); err != nil && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

// capacityOf measures the chain's capacity for overload: the goodput of
// retries off at its best of the fixed concurrencies callers, in this
// run; it prints how it got there.
// The result is at least atLeast.
func (h *Harness) capacityOf(ctx context.Context, spec func(string) ChainSpec, callers []int, atLeast float64) (float64, error) {
	p := h.Params
	t := newTable("callers", "goodput (ok/s): median (range)", "success", "p99")
	capacity := 0.0
	for _, n := range callers {
		runs, err := h.runCase(ctx, fmt.Sprintf("overload capacity, %d callers", n), []string{baseline}, spec, h.fixed(n, p.CapacityLength, p.CapacityDeadline))
		if err != nil {
			return 0, err
		}
		f := medianFigures(runs, 0, 0)[baseline]
		capacity = max(capacity, f.Goodput)
		t.row(n, goodput(f), pct2(f.Success), ms(f.P99))
	}
	if capacity <= 0 {
		return 0, fmt.Errorf("overload: no goodput at any of %v callers: no capacity to scale", callers)
	}
	fmt.Fprintf(h.Out, "Capacity: the goodput of retries off (none) at its best fixed concurrency (%s, %s, %v per run, median of %d): **%.0f ok/s**",
		h.Load.Name(), deadline(p.CapacityDeadline), p.CapacityLength, h.Runs, capacity)
	if capacity < atLeast {
		capacity = atLeast
		fmt.Fprintf(h.Out, "; the factors scale the pool's nominal capacity, %.0f ok/s", capacity)
	}
	fmt.Fprint(h.Out, ".\n\n")
	t.write(h.Out)
	return capacity, nil
}

// reached returns the median over runs of phase i's arrival rate
// reached.
func reached(runs []Run, i int) float64 {
	var v []float64
	for _, r := range runs {
		if len(r.Phases) > i {
			v = append(v, r.Phases[i].Reached)
		}
	}
	return medianOf(v)
}

// Describe prints the stacks a run measures, for the head of the output.
func (h *Harness) Describe() {
	desc := map[string]string{}
	for _, s := range bench.AllStacks() {
		desc[s.Name] = s.Desc
	}
	fmt.Fprintf(h.Out, "Stacks (on every tier, client and server side):\n\n")
	names := withStacks(true)
	for _, s := range slices.Concat(h.Params.CapStacks, h.Params.SlowStacks) {
		if !slices.Contains(names, s) {
			names = append(names, s)
		}
	}
	for _, s := range h.stacks(names) {
		fmt.Fprintf(h.Out, "- `%s`: %s\n", s, desc[s])
	}
	fmt.Fprintln(h.Out)
}
