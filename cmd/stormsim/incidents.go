package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/loadgen"
	"github.com/stormguard/stormguard/internal/testsvc"
)

// The scenarios of --scenario. "kill" is the demo of the modes table
// (runMode); the others show an incident slice by slice.
const (
	scenarioKill    = "kill"
	scenarioOutage  = "outage"
	scenarioPartial = "partial"
	scenarioHang    = "hang"
	scenarioSlow    = "slow"
	scenarioLong    = "long"
	scenarioFleet   = "fleet"
)

// scenarios lists the scenarios with what they show, for the usage.
var scenarios = []struct{ name, about string }{
	{scenarioKill, "payment killed from the start: one request, sustained open-loop load, closed-loop users, recovery, per mode (the default)"},
	{scenarioOutage, "payment UNAVAILABLE after healthy open-loop traffic, then back; per time slice"},
	{scenarioPartial, "payment takes a fifth of its capacity after healthy traffic, then all of it; per time slice"},
	{scenarioHang, "payment holds every call until its caller's deadline after healthy traffic, then answers again; per time slice"},
	{scenarioSlow, "payment five times slower (worker pool, FIFO queue) for a while; per-attempt timeouts; per time slice"},
	{scenarioLong, "a long outage (--for, 30 s by default) and the recovery, in the incident simulator (simulated time)"},
	{scenarioFleet, "replicas of order sharing 1000 req/s while payment is down 4 s, in the incident simulator"},
	{scenarioCapacity, "64 callers (--users) at a fixed concurrency, payment healthy and instant, then failing 10 % at random: success, goodput, p99, refusals; per time slice"},
	{scenarioReplicas, "64 callers at a fixed concurrency, payment as 3 replicas behind round_robin, one alive but failing everything: success, calls per replica; per time slice"},
	{scenarioTail, "payment healthy, 2 % of its answers 50 times slower at random; 400 req/s open-loop for 5 s; p50, p99, p99.9 and calls at payment per request, retries only against hedging (WithHedging); per time slice"},
	{scenarioOverload, "open-loop arrivals at 2x and 8x (--factors) a worker-pool payment's capacity for 2 s, 0.5x before and after: goodput, p99 of successes; per time slice (about 25 s)"},
}

func scenarioNames() []string {
	out := make([]string, len(scenarios))
	for i, s := range scenarios {
		out[i] = s.name
	}
	return out
}

// incidentConfig is what a sliced scenario runs.
type incidentConfig struct {
	scenario string
	rate     int           // open-loop user requests per second
	healthy  time.Duration // before the incident
	during   time.Duration // the incident
	after    time.Duration // after it
	slice    time.Duration
	deadline time.Duration // of each user request
	seed     uint64
	replicas []int // fleet sizes
	// The busy scenarios: callers at a fixed concurrency (capacity,
	// replicas), payment's failure probability after the healthy part
	// (capacity), and the arrivals before and after the overload and
	// during it, as factors of payment's capacity (overload).
	users   int
	flaky   float64
	base    float64
	factors []float64
}

// incidentDefaults are the sizes of each sliced scenario: those of
// bench/cmd/scenarios for outage, partial and slow (DefaultIncidentParams,
// DefaultSlowParams), and of the incident simulator for long and fleet.
func incidentDefaults(name string) incidentConfig {
	c := incidentConfig{scenario: name, seed: 1, slice: 250 * time.Millisecond}
	switch name {
	case scenarioOutage, scenarioPartial, scenarioHang:
		c.rate, c.healthy, c.during, c.after, c.deadline = 300, 1500*time.Millisecond, 3*time.Second, 1500*time.Millisecond, time.Second
	case scenarioSlow:
		c.rate, c.healthy, c.during, c.after, c.deadline = 240, time.Second, time.Second, 2500*time.Millisecond, 500*time.Millisecond
	case scenarioLong:
		c.during = 30 * time.Second
	case scenarioFleet:
		c.replicas = []int{1, 10, 100, 1000}
	case scenarioCapacity:
		c.users, c.healthy, c.during, c.flaky = 64, time.Second, time.Second, 0.1
	case scenarioReplicas:
		c.users, c.healthy, c.during, c.after = 64, 500*time.Millisecond, 2*time.Second, 500*time.Millisecond
	case scenarioOverload:
		c.healthy, c.during, c.after, c.base, c.factors = time.Second, 2*time.Second, time.Second, 0.5, []float64{2, 8}
	case scenarioTail:
		c.rate, c.during, c.slice, c.deadline = 400, 5*time.Second, time.Second, time.Second
	}
	if isBusy(name) {
		c.deadline = busyDeadline
	}
	return c
}

// The slow dependency: payment serves from slowWorkers workers at
// slowService per call (400/s), slowFactor times slower during the
// incident; the retrying modes bound each attempt by slowPerAttempt[hop]
// (hop 0 the edge client, 2 order's client). bench's DefaultSlowParams.
var (
	slowWorkers    = 4
	slowService    = 10 * time.Millisecond
	slowFactor     = 5
	slowPerAttempt = [3]time.Duration{400 * time.Millisecond, 250 * time.Millisecond, 150 * time.Millisecond}
)

// chainMode is a retry stack with its options chosen per process, for
// the scenarios on the in-process gRPC chain: process(i) is the stack of
// process i (0 the edge client, i > 0 tier i-1), whose client side is hop
// i (see startStacks).
type chainMode struct {
	name, about string
	process     func(proc int) (stack, error)
}

// chainModes returns the modes of ms for the scenarios on the chain.
func chainModes(ms []mode) []chainMode {
	out := make([]chainMode, len(ms))
	for i, m := range ms {
		out[i] = chainMode{name: m.name, about: m.about, process: func(int) (stack, error) { return m.process(nil) }}
	}
	return out
}

// slowModes are the modes of the slow-dependency scenario: every
// retrying one bounds each attempt by slowPerAttempt.
var slowModes = []chainMode{
	{name: "off", about: "no interceptor, no retries",
		process: func(int) (stack, error) { return stack{}, nil }},
	{name: "naive", about: "go-grpc-middleware retry on every hop: WithMax(3), UNAVAILABLE and DEADLINE_EXCEEDED, WithPerRetryTimeout",
		process: func(hop int) (stack, error) {
			return stack{dial: []grpc.DialOption{grpc.WithChainUnaryInterceptor(retry.UnaryClientInterceptor(
				retry.WithMax(3),
				retry.WithCodes(codes.Unavailable, codes.DeadlineExceeded),
				retry.WithPerRetryTimeout(slowPerAttempt[min(hop, 2)]),
				retry.WithBackoff(retry.BackoffExponentialWithJitter(naiveBackoffBase, naiveBackoffJitter)),
			))}}, nil
		}},
	{name: "stormguard", about: "budget and breakers per hop, per-attempt timeouts, admission control on every server",
		process: func(hop int) (stack, error) {
			set, err := breaker.NewSet(breaker.Config{}, 0)
			if err != nil {
				return stack{}, err
			}
			return slowStack(interceptor.WithBudget(budget.Config{}), interceptor.WithBreaker(set),
				interceptor.WithAdmission(admission.Config{}), interceptor.WithPerAttemptTimeout(slowPerAttempt[min(hop, 2)]))
		}},
	{name: recommendedMode, about: "interceptor.Recommended() on every process plus per-attempt timeouts: adaptive throttle and budget per hop, admission control on every server",
		process: func(hop int) (stack, error) {
			return slowStack(append(interceptor.Recommended(), interceptor.WithPerAttemptTimeout(slowPerAttempt[min(hop, 2)]))...)
		}},
}

// slowStack is one Interceptors of opts, both sides.
func slowStack(opts ...interceptor.Option) (stack, error) {
	ic, err := interceptor.New(opts...)
	if err != nil {
		return stack{}, err
	}
	return stack{dial: ic.DialOptions(), server: ic.ServerOptions(), ic: ic}, nil
}

func slowModeNames() []string {
	out := make([]string, len(slowModes))
	for i, m := range slowModes {
		out[i] = m.name
	}
	return out
}

// parseSlowModes is parseModes for the slow scenario's modes.
func parseSlowModes(s string) ([]chainMode, error) {
	if s == "" || s == "all" {
		return slowModes, nil
	}
	var out []chainMode
	for name := range strings.SplitSeq(s, ",") {
		name = strings.TrimSpace(name)
		found := false
		for _, m := range slowModes {
			if m.name == name {
				out = append(out, m)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown mode %q for --scenario slow (want one of %s)", name, strings.Join(slowModeNames(), ", "))
		}
	}
	return out, nil
}

// sliceStat is what the user requests of one time slice (or a longer
// span) saw: the --json format.
type sliceStat struct {
	TMS             int64   `json:"t_ms"`     // start, since the start of the load
	WidthMS         int64   `json:"width_ms"` // length of the span
	Requests        int     `json:"requests"`
	Success         float64 `json:"success"`           // share served, 0 to 1
	CallsPerRequest float64 `json:"calls_per_request"` // calls at payment per user request
}

// column is one mode's (or fleet size's) results in a sliced scenario.
type column struct {
	Mode   string      `json:"mode"`
	Slices []sliceStat `json:"slices"`
	// Incident is the whole incident as one span, First its first
	// second.
	Incident sliceStat `json:"incident"`
	First    sliceStat `json:"first_second"`
	// RecoveryMS is the time from the end of the incident until every
	// later slice (25 ms on the chain, 50 ms in the simulator) served
	// >= 99 % of its users; -1: not before the load ended.
	RecoveryMS int64 `json:"recovery_ms"`
	// Floor (fleet only): replicas / user requests during the outage,
	// the least calls per request (each replica's first call); and
	// RestartRecoveryMS: the recovery when the outage is a restart whose
	// reconnecting channels revive the throttles.
	Floor             float64 `json:"floor,omitempty"`
	RestartRecoveryMS *int64  `json:"restart_recovery_ms,omitempty"`
	// Health and HealthRecoveryMS (fleet only): the outage and the
	// recovery when payment's health is watched (interceptor.WithHealth
	// and client-side health checking).
	Health           *sliceStat `json:"health_incident,omitempty"`
	HealthRecoveryMS *int64     `json:"health_recovery_ms,omitempty"`
}

// sliced is the result of a sliced scenario.
type sliced struct {
	Scenario   string     `json:"scenario"`
	Title      string     `json:"title"`
	Columns    []column   `json:"columns"`
	legend     []string   // "mode\twhat it is"
	notes      []string   // printed under the table
	extra      [][]string // more summary rows: label, then one cell per column
	begin, end time.Duration
}

func stat(sl loadgen.Slice, width time.Duration) sliceStat {
	st := sliceStat{TMS: sl.Start.Milliseconds(), WidthMS: width.Milliseconds(), Requests: len(sl.Samples)}
	if st.Requests > 0 {
		st.Success = round(sl.Samples.Success(), 4)
		st.CallsPerRequest = round(sl.PerRequest(), 3)
	}
	return st
}

// runChainIncident runs an incident on a fresh in-process chain with m on
// every hop.
func runChainIncident(ic incidentConfig, m chainMode) (column, error) {
	col := column{Mode: m.name, RecoveryMS: -1}
	stacks, err := buildStacks(m.process)
	if err != nil {
		return col, err
	}
	chain, err := startStacks(ic.seed, stacks)
	if err != nil {
		return col, err
	}
	defer chain.Close()
	pay := chain.Tier("payment")
	if ic.scenario == scenarioSlow {
		pay.SetPool(testsvc.Pool{Workers: slowWorkers, Service: slowService})
		defer pay.StopPool()
	}
	if err := loadgen.Warm(chain); err != nil {
		return col, err
	}
	var on, off func()
	switch ic.scenario {
	case scenarioOutage:
		on, off = func() { pay.SetDown(codes.Unavailable) }, pay.SetUp
	case scenarioPartial:
		full := int64(ic.rate)
		pay.SetCapacity(testsvc.Capacity{PerSecond: full})
		on = func() { pay.SetCapacity(testsvc.Capacity{PerSecond: max(full/5, 1)}) }
		off = func() { pay.SetCapacity(testsvc.Capacity{PerSecond: full}) }
		// Start on a second boundary, so that the loss starts and ends
		// on boundaries of payment's per-second counter (as bench does).
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	case scenarioHang:
		// An hour's latency ends only with the call's context.
		on, off = func() { pay.SetLatency(time.Hour) }, func() { pay.SetLatency(0) }
	case scenarioSlow:
		on = func() { pay.SetService(slowService * time.Duration(slowFactor)) }
		off = func() { pay.SetService(slowService) }
	default:
		return col, fmt.Errorf("scenario %q does not run on the chain", ic.scenario)
	}
	begin, end := ic.healthy, ic.healthy+ic.during
	total := end + ic.after
	s, sl := loadgen.Sliced(chain, ic.rate, total, ic.deadline, ic.slice,
		func() int64 { return pay.Attempts(testsvc.Unary) },
		[]loadgen.Step{{At: begin, Do: on}, {At: end, Do: off}})
	for _, x := range sl {
		col.Slices = append(col.Slices, stat(x, ic.slice))
	}
	whole := loadgen.Sum(sl, begin, end)
	whole.Samples = s.Between(begin, end)
	col.Incident = stat(whole, ic.during)
	first := min(time.Second, ic.during)
	col.First = stat(loadgen.Sum(sl, begin, begin+first), first)
	if d, ok := s.Recovery(end, total, 25*time.Millisecond); ok {
		col.RecoveryMS = d.Milliseconds()
	}
	return col, nil
}

// runChainScenario runs a sliced scenario on the chain for every mode.
func runChainScenario(ctx context.Context, ic incidentConfig, ms []chainMode, p progress) (sliced, error) {
	out := sliced{Scenario: ic.scenario, begin: ic.healthy, end: ic.healthy + ic.during}
	switch ic.scenario {
	case scenarioOutage:
		out.Title = fmt.Sprintf("payment UNAVAILABLE from %v for %v after healthy traffic, then back for %v", ic.healthy, ic.during, ic.after)
	case scenarioPartial:
		out.Title = fmt.Sprintf("payment takes %d calls/s, a fifth of it from %v for %v, then all of it for %v", ic.rate, ic.healthy, ic.during, ic.after)
	case scenarioHang:
		out.Title = fmt.Sprintf("payment holds every call until its caller's deadline from %v for %v after healthy traffic, then answers again for %v", ic.healthy, ic.during, ic.after)
	case scenarioSlow:
		out.Title = fmt.Sprintf("payment (%d workers at %v per call, FIFO queue that ignores cancellation) %d times slower from %v for %v, then %v; per-attempt timeouts %v / %v / %v (edge / gateway / order client)",
			slowWorkers, slowService, slowFactor, ic.healthy, ic.during, ic.after, slowPerAttempt[0], slowPerAttempt[1], slowPerAttempt[2])
	}
	out.Title += fmt.Sprintf("; edge client -> gateway -> order -> payment over gRPC in process, %d user requests/s open-loop, deadline %v", ic.rate, ic.deadline)
	for _, m := range ms {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		p.phase(m.name, ic.scenario)
		c, err := runChainIncident(ic, m)
		if err != nil {
			return out, fmt.Errorf("%s: %w", m.name, err)
		}
		out.Columns = append(out.Columns, c)
		out.legend = append(out.legend, m.name+"\t"+m.about)
	}
	out.notes = append(out.notes, "time to 99 %: from the end of the incident to the end of the last 25 ms slice (by request start) with less than 99 % success.")
	return out, nil
}
