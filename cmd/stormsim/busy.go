package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/loadgen"
	"github.com/stormguard/stormguard/internal/testsvc"
)

// The everyday cases of DESIGN.md "Busy is not broken", where protection
// must stay silent (capacity, replicas) or shed only the excess
// (overload), each against retries off in the same run.
const (
	scenarioCapacity = "capacity"
	scenarioReplicas = "replicas"
	scenarioOverload = "overload"
)

// isBusy reports whether scenario is one of the everyday cases.
func isBusy(scenario string) bool {
	return scenario == scenarioCapacity || scenario == scenarioReplicas || scenario == scenarioOverload
}

// offMode is the baseline of the busy scenarios, as of the slow one: no
// interceptor, no retries.
var offMode = mode{name: "off", about: "no interceptor, no retries (the baseline)",
	process: func(*telemetry) (stack, error) { return stack{}, nil }}

// busyDefaultModes run when --modes is not given.
var busyDefaultModes = []string{"off", recommendedMode, "stormguard"}

// parseBusyModes reads --modes for a busy scenario: off and the demo's
// modes; "all" is off and every demo mode.
func parseBusyModes(s string) ([]mode, error) {
	if s == "all" {
		return append([]mode{offMode}, modes...), nil
	}
	var out []mode
	for name := range strings.SplitSeq(s, ",") {
		name = strings.TrimSpace(name)
		if name == offMode.name {
			out = append(out, offMode)
			continue
		}
		m, err := findMode(name)
		if err != nil {
			return nil, fmt.Errorf("%w; or %q, retries off", err, offMode.name)
		}
		out = append(out, m)
	}
	return out, nil
}

// busyReplicas is the number of payment replicas of --scenario replicas;
// the last of them fails everything during the incident.
const busyReplicas = 3

// Payment of --scenario overload serves from overloadWorkers workers at
// overloadService per call (a FIFO queue that ignores cancellation, as
// --scenario slow's): its capacity is overloadCapacity calls a second.
const (
	overloadWorkers  = 4
	overloadService  = 10 * time.Millisecond
	overloadCapacity = int(overloadWorkers * time.Second / overloadService)
)

// busyDeadline is the deadline of every user request of the busy
// scenarios.
const busyDeadline = time.Second

// counts of one process's stormguard events. The observer is called on
// the RPC's goroutines: atomic counters only.
type eventCounts struct {
	admission, throttled, retryThrottled, retryBudget, retryBreaker, down, opened atomic.Int64
	seen                                                                          atomic.Int64 // every event, for the tests
}

func (c *eventCounts) Observe(_ context.Context, e interceptor.Event) {
	c.seen.Add(1)
	switch e.Kind {
	case interceptor.EventAdmissionRefused:
		c.admission.Add(1)
	case interceptor.EventThrottled:
		c.throttled.Add(1)
	case interceptor.EventRetryRefused:
		switch e.Reason {
		case interceptor.StopThrottled:
			c.retryThrottled.Add(1)
		case interceptor.StopBudget:
			c.retryBudget.Add(1)
		case interceptor.StopBreakerOpen:
			c.retryBreaker.Add(1)
		}
	case interceptor.EventTargetDown:
		c.down.Add(1)
	case interceptor.EventBreakerStateChange:
		if e.To == breaker.Open {
			c.opened.Add(1)
		}
	}
}

// numEventCounts is the length of eventCounts.read.
const numEventCounts = 7

func (c *eventCounts) read() []int64 {
	return []int64{c.admission.Load(), c.throttled.Load(), c.retryThrottled.Load(), c.retryBudget.Load(),
		c.retryBreaker.Load(), c.down.Load(), c.opened.Load()}
}

// refusals are stormguard's refusals and down marks over a span: the
// --json format.
type refusals struct {
	// Admission: requests a server refused before its handler
	// (EventAdmissionRefused).
	Admission int64 `json:"admission_refused"`
	// Throttled: attempts the adaptive throttle refused (EventThrottled);
	// each also ends its call as a RetryThrottled.
	Throttled int64 `json:"throttled"`
	// RetryThrottled, RetryBudget, RetryBreaker: calls that stopped
	// retrying (EventRetryRefused) for the throttle (StopThrottled: its
	// refused attempts, and retries it would refuse), the retry budget
	// (StopBudget) or an open breaker (StopBreakerOpen).
	RetryThrottled int64 `json:"retry_refused_throttled"`
	RetryBudget    int64 `json:"retry_refused_budget"`
	RetryBreaker   int64 `json:"retry_refused_breaker"`
	// Down: targets the throttle marked down (EventTargetDown); Opened:
	// breakers that opened.
	Down   int64 `json:"target_down"`
	Opened int64 `json:"breaker_opened"`
}

func refusalsOf(v []int64) refusals {
	return refusals{Admission: v[0], Throttled: v[1], RetryThrottled: v[2], RetryBudget: v[3], RetryBreaker: v[4], Down: v[5], Opened: v[6]}
}

func (r refusals) add(o refusals) refusals {
	return refusals{r.Admission + o.Admission, r.Throttled + o.Throttled, r.RetryThrottled + o.RetryThrottled,
		r.RetryBudget + o.RetryBudget, r.RetryBreaker + o.RetryBreaker, r.Down + o.Down, r.Opened + o.Opened}
}

// refused is every attempt stormguard declined, each once: an attempt
// the throttle refused is reported twice (EventThrottled, then the
// call's EventRetryRefused with StopThrottled) and counted once.
func (r refusals) refused() int64 {
	return r.Admission + r.RetryThrottled + r.RetryBudget + r.RetryBreaker
}

// downs is every target called down: by a throttle, or a breaker opening.
func (r refusals) downs() int64 { return r.Down + r.Opened }

// busyRow is what the user requests that started in one span saw, and
// what stormguard did in it: the --json format.
type busyRow struct {
	TMS         int64   `json:"t_ms"`
	WidthMS     int64   `json:"width_ms"`
	Requests    int     `json:"requests"`
	OK          int     `json:"ok"`
	Success     float64 `json:"success"`       // OK / requests, 0 to 1
	OKPerSecond float64 `json:"ok_per_second"` // goodput: OK answers that arrived in the span, per second
	P99MS       float64 `json:"p99_ms"`        // of every request
	P99OKMS     float64 `json:"p99_ok_ms"`     // of the successful ones
	// Refusals over every process of the chain; nil for a mode without
	// stormguard.
	Refusals *refusals `json:"refusals,omitempty"`
	// CallsPerReplica: calls each replica of payment received
	// (--scenario replicas).
	CallsPerReplica []int64 `json:"calls_per_replica,omitempty"`
}

// busyPart is a phase of a busy scenario as one span.
type busyPart struct {
	Name string `json:"name"`
	busyRow
}

// procRefusals are one process's refusals over the whole run.
type procRefusals struct {
	Process string `json:"process"`
	refusals
}

// busyColumn is one mode's run.
type busyColumn struct {
	Mode      string         `json:"mode"`
	Factor    float64        `json:"factor,omitempty"` // overload: arrivals during the overload / capacity
	Slices    []busyRow      `json:"slices"`
	Parts     []busyPart     `json:"parts"`
	Processes []procRefusals `json:"refusals_by_process,omitempty"`
}

// busyReport is the result of a busy scenario: the --json format.
type busyReport struct {
	Scenario          string       `json:"scenario"`
	Title             string       `json:"title"`
	Users             int          `json:"users,omitempty"`               // fixed-concurrency callers
	CapacityPerSecond int          `json:"capacity_per_second,omitempty"` // overload: payment's
	DeadlineMS        int64        `json:"deadline_ms"`
	Columns           []busyColumn `json:"columns"`

	legend     []string // "mode\twhat it is"
	notes      []string
	begin, end time.Duration // the incident, marked * in the table
}

// busyPhase is a named span of a run.
type busyPhase struct {
	name     string
	from, to time.Duration
}

// busyRun is one run of a busy scenario: a fresh chain with m on every
// process, and what it counts.
type busyRun struct {
	chain  *testsvc.Chain
	procs  []string
	counts []*eventCounts
	reps   []*testsvc.Tier // payment's replicas
	sg     bool            // m runs stormguard: refusals mean something
}

// startBusy starts a chain with m on every process: the edge client, the
// tiers, and each further replica of payment (replicas > 1), each with
// an observer of its own.
func startBusy(m mode, seed uint64, replicas int) (*busyRun, error) {
	procs := append([]string{"edge"}, testsvc.DefaultTiers...)
	for r := 1; r < replicas; r++ {
		procs = append(procs, fmt.Sprintf("payment#%d", r))
	}
	r := &busyRun{procs: procs}
	stacks := make([]stack, len(procs))
	for i := range procs {
		c := &eventCounts{}
		st, err := m.process(&telemetry{observer: c})
		if err != nil {
			return nil, err
		}
		stacks[i] = st
		r.counts = append(r.counts, c)
		r.sg = r.sg || st.ic != nil
	}
	tiers := len(testsvc.DefaultTiers)
	chain, err := testsvc.Start(testsvc.Config{
		DialOptions:          func(hop int) []grpc.DialOption { return stacks[hop].dial },
		ServerOptions:        func(tier int) []grpc.ServerOption { return stacks[tier+1].server },
		ReplicaServerOptions: func(rep int) []grpc.ServerOption { return stacks[tiers+rep].server },
		Seed:                 seed,
		Replicas:             replicas,
	})
	if err != nil {
		return nil, err
	}
	r.chain = chain
	r.reps = chain.Replicas("payment")
	return r, nil
}

// read returns every counter of the run: each process's event counts,
// then the calls each replica of payment received.
func (r *busyRun) read() []int64 {
	var v []int64
	for _, c := range r.counts {
		v = append(v, c.read()...)
	}
	for _, t := range r.reps {
		v = append(v, t.Received(testsvc.Unary))
	}
	return v
}

// okEnded counts the successful requests of s that ended in [from, to).
func okEnded(s loadgen.Samples, from, to time.Duration) int {
	n := 0
	for _, x := range s {
		if end := x.Start + x.Latency; x.Code == codes.OK && end >= from && end < to {
			n++
		}
	}
	return n
}

// row summarizes the requests s that started in a span of width from
// its start, the okDone successful answers that ended in it, and the
// counters' increments v (as read).
func (r *busyRun) row(s loadgen.Samples, okDone int, start, width time.Duration, v []int64) busyRow {
	row := busyRow{TMS: start.Milliseconds(), WidthMS: width.Milliseconds(), Requests: len(s)}
	var ok loadgen.Samples
	for _, x := range s {
		if x.Code == codes.OK {
			ok = append(ok, x)
		}
	}
	row.OK = len(ok)
	if row.Requests > 0 {
		row.Success = round(float64(row.OK)/float64(row.Requests), 4)
		row.P99MS = ms(s.Percentile(0.99))
	}
	if len(ok) > 0 {
		row.P99OKMS = ms(ok.Percentile(0.99))
	}
	row.OKPerSecond = round(float64(okDone)/width.Seconds(), 1)
	if r.sg {
		var all refusals
		for i := range r.counts {
			all = all.add(refusalsOf(v[i*numEventCounts:]))
		}
		row.Refusals = &all
	}
	if len(r.reps) > 1 {
		row.CallsPerReplica = slices.Clone(v[len(r.counts)*numEventCounts:])
	}
	return row
}

// column cuts the finished load s (marked by mk) into the slices and
// phases of a column.
func (r *busyRun) column(name string, s loadgen.Samples, mk *loadgen.Marker, width time.Duration, phases []busyPhase) busyColumn {
	col := busyColumn{Mode: name}
	per := make([][]int64, mk.Slices())
	const forever = time.Duration(1<<63 - 1)
	for i := range per {
		per[i] = mk.Counts(i)
		from, to := time.Duration(i)*width, time.Duration(i+1)*width
		if i == len(per)-1 {
			to = forever // as the last slice's requests: answers after the end
		}
		col.Slices = append(col.Slices, r.row(mk.Samples(s, i), okEnded(s, from, to), from, width, per[i]))
	}
	sum := func(from, to time.Duration) []int64 {
		var v []int64
		for i, c := range per {
			if at := time.Duration(i) * width; at >= from && at < to {
				if v == nil {
					v = make([]int64, len(c))
				}
				for k := range c {
					v[k] += c[k]
				}
			}
		}
		return v
	}
	for i, ph := range phases {
		to := ph.to
		if i == len(phases)-1 {
			to = forever // as the last slice
		}
		v := sum(ph.from, ph.to)
		if v == nil { // a phase no slice starts in
			v = make([]int64, len(r.counts)*numEventCounts+len(r.reps))
		}
		col.Parts = append(col.Parts, busyPart{Name: ph.name, busyRow: r.row(s.Between(ph.from, to), okEnded(s, ph.from, to), ph.from, ph.to-ph.from, v)})
	}
	if r.sg {
		total := sum(0, forever)
		for i, p := range r.procs {
			col.Processes = append(col.Processes, procRefusals{Process: p, refusals: refusalsOf(total[i*numEventCounts:])})
		}
	}
	return col
}

// runBusy runs a busy scenario for every mode (and, for overload, every
// factor).
func runBusy(ctx context.Context, ic incidentConfig, ms []mode, p progress) (busyReport, error) {
	out := busyReport{Scenario: ic.scenario, DeadlineMS: ic.deadline.Milliseconds()}
	begin, end := ic.healthy, ic.healthy+ic.during
	out.begin, out.end = begin, end
	total := end + ic.after
	var phases []busyPhase
	switch ic.scenario {
	case scenarioCapacity:
		out.Users = ic.users
		out.Title = fmt.Sprintf("%d callers at a fixed concurrency (each sends its next request the moment an answer comes, error or not); payment healthy and instant for %v, then failing %.0f %% of calls at random for %v",
			ic.users, ic.healthy, ic.flaky*100, ic.during)
		phases = []busyPhase{{"healthy", 0, begin}, {fmt.Sprintf("%.0f %% failures", ic.flaky*100), begin, end}}
	case scenarioReplicas:
		out.Users = ic.users
		out.Title = fmt.Sprintf("%d callers at a fixed concurrency; payment as %d replicas behind round_robin, the last of them alive but failing every call from %v for %v, then healthy again for %v",
			ic.users, busyReplicas, ic.healthy, ic.during, ic.after)
		phases = []busyPhase{{"healthy", 0, begin}, {"one failing", begin, end}, {"healthy again", end, total}}
	case scenarioOverload:
		out.CapacityPerSecond = overloadCapacity
		out.Title = fmt.Sprintf("open-loop arrivals (sent whatever the answers); payment serves %d calls/s (%d workers at %v per call, FIFO queue that ignores cancellation); %.1fx its capacity for %v, then each factor for %v, then %.1fx for %v",
			overloadCapacity, overloadWorkers, overloadService, ic.base, ic.healthy, ic.during, ic.base, ic.after)
	}
	out.Title += fmt.Sprintf("; edge client -> gateway -> order -> payment over gRPC in process, deadline %v", ic.deadline)
	factors := []float64{0}
	if ic.scenario == scenarioOverload {
		factors = ic.factors
	}
	var stopped error // an interrupt: what finished is still printed
run:
	for _, f := range factors {
		for _, m := range ms {
			if stopped = ctx.Err(); stopped != nil {
				break run
			}
			if f > 0 {
				p.phase(m.name, fmt.Sprintf("%gx", f))
				phases = []busyPhase{{fmt.Sprintf("%gx before", ic.base), 0, begin}, {fmt.Sprintf("%gx", f), begin, end}, {fmt.Sprintf("%gx after", ic.base), end, total}}
			} else {
				p.phase(m.name, ic.scenario)
			}
			c, err := runBusyMode(ic, m, f, total, phases)
			if err != nil {
				return out, fmt.Errorf("%s: %w", m.name, err)
			}
			out.Columns = append(out.Columns, c)
		}
	}
	for _, m := range ms {
		out.legend = append(out.legend, m.name+"\t"+m.about)
	}
	out.notes = append(out.notes,
		"refused: attempts stormguard declined, each once, over every process: admission refusals, throttled attempts, retries the throttle, the budget or an open breaker denied; down: targets the throttle marked down, and breakers opened. - : no stormguard in the mode.",
		"ok/s: OK answers that arrived in the slice (the last: until the last request ended), per second of the slice; the other columns: the requests that started in it.")
	return out, stopped
}

// runBusyMode runs one mode of a busy scenario on a fresh chain (at
// factor f, for overload).
func runBusyMode(ic incidentConfig, m mode, f float64, total time.Duration, phases []busyPhase) (busyColumn, error) {
	replicas := 0
	if ic.scenario == scenarioReplicas {
		replicas = busyReplicas
	}
	r, err := startBusy(m, ic.seed, replicas)
	if err != nil {
		return busyColumn{}, err
	}
	defer r.chain.Close()
	pay := r.chain.Tier("payment")
	if ic.scenario == scenarioOverload {
		pay.SetPool(testsvc.Pool{Workers: overloadWorkers, Service: overloadService})
		defer pay.StopPool()
	}
	if err := loadgen.Warm(r.chain); err != nil {
		return busyColumn{}, err
	}
	begin, end := ic.healthy, ic.healthy+ic.during
	var steps []loadgen.Step
	switch ic.scenario {
	case scenarioCapacity:
		steps = []loadgen.Step{{At: begin, Do: func() { pay.SetFlaky(ic.flaky) }}}
	case scenarioReplicas:
		bad := r.reps[len(r.reps)-1]
		steps = []loadgen.Step{{At: begin, Do: func() { bad.SetDown(codes.Unavailable) }}, {At: end, Do: bad.SetUp}}
	}
	mk := loadgen.NewMarker(total, ic.slice, r.read, steps)
	var s loadgen.Samples
	if ic.scenario == scenarioOverload {
		base := max(int(ic.base*float64(overloadCapacity)), 1)
		rates := []loadgen.Rate{{From: 0, PerSecond: base}, {From: begin, PerSecond: max(int(f*float64(overloadCapacity)), 1)}, {From: end, PerSecond: base}}
		s = loadgen.OpenLoopRates(r.chain, rates, total, ic.deadline, mk.Phase)
	} else {
		s = loadgen.FixedConcurrency(r.chain, ic.users, total, ic.deadline, time.Millisecond, mk.Phase)
	}
	mk.Finish()
	col := r.column(m.name, s, mk, ic.slice, phases)
	col.Factor = f
	return col, nil
}
