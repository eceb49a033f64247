package incidentsim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/clock"
)

// FaultKind is what payment does during a Fault.
type FaultKind int

// The kinds of fault.
const (
	// Down: every call fails at once with UNAVAILABLE.
	Down FaultKind = iota + 1
	// Random: a call fails with UNAVAILABLE with probability Value.
	Random
	// Capacity: payment serves Value of its nominal capacity (Scenario.Load
	// per second) and sheds the rest with UNAVAILABLE.
	Capacity
	// Hang: no call is answered; the caller's deadline or the per-attempt
	// timeout ends it.
	Hang
)

// Fault is payment's behaviour from From to To.
type Fault struct {
	From, To time.Duration
	Kind     FaultKind
	Value    float64
	// Restart: the outage is a restart of payment's process, so every
	// replica's connection breaks at From and is ready again at its
	// first reconnect attempt after To, on grpc-go's default connection
	// backoff (1 s, growing 1.6 times, +-20 % jitter, at most 120 s). The
	// throttle is told (Throttle.Connectivity) before each attempt.
	Restart bool
}

// Scenario is one simulated incident.
type Scenario struct {
	Name     string
	Duration time.Duration // arrivals stop here; the calls in flight finish
	Load     float64       // user requests per second, all replicas together
	Replicas int           // of order, each with its own mechanisms; 0 means 1
	Faults   []Fault
	// Deadline of each user request (0: 1 s); PerAttemptTimeout of each
	// attempt (0: none).
	Deadline, PerAttemptTimeout time.Duration
	// RTT is payment's answer time (0: 2 ms).
	RTT  time.Duration
	Seed uint64
	// Arrivals, if set, are the user requests' arrival times instead of
	// Poisson arrivals at Load.
	Arrivals []time.Duration
	// Health: payment reports its own state through gRPC health checking
	// (an admission.Serving, as interceptor.WithHealth does) and every
	// replica's channel watches it: the channel is not ready while
	// payment is not serving, from HealthDelay after each change.
	// Payment's answers count as served or failed; hangs count as
	// nothing.
	Health bool
	// Serving configures payment's health tracker with Health (the
	// simulator's clock is set here).
	Serving admission.ServingConfig
}

// HealthDelay is the time a change of payment's health takes to reach a
// replica's channel over its watch stream: half the default RTT.
const HealthDelay = time.Millisecond

// Stack builds the mechanisms of one replica of order.
type Stack struct {
	Name string
	// Attempts per call, first included.
	Attempts int
	// New returns one replica's mechanisms on clk and rnd; nil fields are
	// off.
	New func(clk *clock.Fake, rnd func() float64) (Guard, error)
}

// Guard is the mechanisms of one replica.
type Guard struct {
	Budget   budget.Limiter
	Breaker  *breaker.Breaker
	Throttle *adaptive.Throttle
}

// Slice is the result of the user requests that arrived in one time slice,
// and the calls payment received in it.
type Slice struct {
	Start            time.Duration
	Users, Successes int
	Calls            int // attempts that reached payment in the slice
	// Local: attempts that failed at once on a replica's channel that was
	// not ready (they never reached payment).
	Local int
}

// Result is a scenario's outcome, by slice of SliceWidth.
type Result struct {
	SliceWidth time.Duration
	Slices     []Slice
	Refused    int // attempts refused locally by a mechanism
}

// Window sums the slices in [from, to).
func (r *Result) Window(from, to time.Duration) Slice {
	var s Slice
	s.Start = from
	for _, sl := range r.Slices {
		if sl.Start >= from && sl.Start < to {
			s.Users += sl.Users
			s.Successes += sl.Successes
			s.Calls += sl.Calls
			s.Local += sl.Local
		}
	}
	return s
}

// Success returns the share of users served, or NaN without users.
func (s Slice) Success() float64 {
	if s.Users == 0 {
		return math.NaN()
	}
	return float64(s.Successes) / float64(s.Users)
}

// CallsPerRequest returns calls at payment per user request.
func (s Slice) CallsPerRequest() float64 {
	if s.Users == 0 {
		return math.NaN()
	}
	return float64(s.Calls) / float64(s.Users)
}

// Recovery returns the time after back until the share of users served
// reaches at least 0.99 in every slice from then on (up to until); -1 if
// it never does.
func (r *Result) Recovery(back, until time.Duration) time.Duration {
	rec := time.Duration(0)
	seen := false
	for _, sl := range r.Slices {
		if sl.Start < back || sl.Start+r.SliceWidth > until || sl.Users == 0 {
			continue
		}
		seen = true
		if sl.Success() < 0.99 {
			rec = sl.Start + r.SliceWidth - back
		}
	}
	if !seen || back+rec >= until {
		return -1
	}
	return rec
}

type evKind int

const (
	evArrive evKind = iota
	evAttempt
	evAnswer
	evTrial // payment's health trial is due
)

type event struct {
	at   time.Duration
	seq  int64
	kind evKind
	req  *request
	// evAnswer: what payment did; local: the replica's channel was not
	// ready, payment saw nothing.
	ok, timedOut, local bool
}

type queue []*event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type request struct {
	g        *Guard
	replica  int
	arrived  time.Duration
	deadline time.Duration
	attempts int
	prev     time.Duration
	bp       breaker.Permit
	ap       adaptive.Permit
}

type sim struct {
	sc     Scenario
	st     Stack
	clk    *clock.Fake
	base   time.Time
	rng    *rand.Rand
	q      queue
	seq    int64
	res    Result
	tokens float64 // payment's capacity bucket
	tokAt  time.Duration
	ready  []time.Duration // per replica, after a Restart fault
	// With Scenario.Health: payment's state, and its changes in order.
	serving *admission.Serving
	health  []healthChange
}

type healthChange struct {
	at      time.Duration
	serving bool
}

// reconnect returns when a connection that broke at from, to a server
// back at to, is ready again: grpc-go's default backoff.
func reconnect(from, to time.Duration, rnd func() float64) time.Duration {
	t, d := from, time.Second
	for t < to {
		t += time.Duration(float64(d) * (0.8 + 0.4*rnd()))
		d = min(time.Duration(float64(d)*1.6), 120*time.Second)
	}
	return t
}

// Run simulates sc with st and returns the result by slices of width.
func Run(sc Scenario, st Stack, width time.Duration) (*Result, error) {
	if sc.Replicas <= 0 {
		sc.Replicas = 1
	}
	if sc.Deadline <= 0 {
		sc.Deadline = time.Second
	}
	if sc.RTT <= 0 {
		sc.RTT = 2 * time.Millisecond
	}
	if st.Attempts <= 0 {
		st.Attempts = 1
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &sim{sc: sc, st: st, clk: clock.NewFake(base), base: base, rng: rand.New(rand.NewPCG(sc.Seed, 0x5eed))}
	n := int((sc.Duration + sc.Deadline + width) / width)
	s.res = Result{SliceWidth: width, Slices: make([]Slice, n)}
	for i := range s.res.Slices {
		s.res.Slices[i].Start = time.Duration(i) * width
	}
	guards := make([]Guard, sc.Replicas)
	ready := make([]time.Duration, sc.Replicas)
	for i := range guards {
		g, err := st.New(s.clk, s.rng.Float64)
		if err != nil {
			return nil, fmt.Errorf("stack %s: %w", st.Name, err)
		}
		guards[i] = g
		for _, f := range sc.Faults {
			if f.Restart {
				ready[i] = reconnect(f.From, f.To, s.rng.Float64)
			}
		}
	}
	s.ready = ready
	if sc.Health {
		cfg := sc.Serving
		cfg.Clock = s.clk
		sv, err := admission.NewServing(cfg)
		if err != nil {
			return nil, err
		}
		s.serving = sv
	}
	arrive := func(t time.Duration) {
		i := s.rng.IntN(len(guards))
		s.push(&event{at: t, kind: evArrive, req: &request{g: &guards[i], replica: i, arrived: t, deadline: t + sc.Deadline}})
	}
	for _, t := range sc.Arrivals {
		arrive(t)
	}
	// Poisson arrivals, each to a replica chosen at random.
	for t := time.Duration(0); sc.Arrivals == nil; {
		t += time.Duration(s.rng.ExpFloat64() / sc.Load * float64(time.Second))
		if t >= sc.Duration {
			break
		}
		arrive(t)
	}
	for s.q.Len() > 0 {
		e := heap.Pop(&s.q).(*event)
		s.clk.Set(s.base.Add(e.at))
		switch e.kind {
		case evArrive:
			s.slice(e.at).Users++
			if e.req.g.Budget != nil {
				e.req.g.Budget.RecordRequest()
			}
			s.attempt(e.at, e.req)
		case evAttempt:
			s.attempt(e.at, e.req)
		case evAnswer:
			s.answer(e)
		case evTrial:
			s.trial(e.at)
		}
	}
	return &s.res, nil
}

func (s *sim) push(e *event) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.q, e)
}

func (s *sim) slice(t time.Duration) *Slice {
	i := int(t / s.res.SliceWidth)
	return &s.res.Slices[min(max(i, 0), len(s.res.Slices)-1)]
}

// fault returns payment's fault at t, if any.
func (s *sim) fault(t time.Duration) (Fault, bool) {
	for _, f := range s.sc.Faults {
		if t >= f.From && t < f.To {
			return f, true
		}
	}
	return Fault{}, false
}

// attempt makes the request's next attempt at t, as the interceptor's
// admit does: the breaker, then the throttle.
func (s *sim) attempt(t time.Duration, r *request) {
	if t >= r.deadline {
		return // failed
	}
	g := r.g
	r.bp, r.ap = breaker.Permit{}, adaptive.Permit{}
	if g.Breaker != nil {
		p, err := g.Breaker.Allow()
		if err != nil {
			s.res.Refused++
			return
		}
		r.bp = p
	}
	ready := s.channelReady(r.replica, t)
	if g.Throttle != nil && (s.ready != nil || s.serving != nil) {
		g.Throttle.Connectivity(ready)
	}
	if g.Throttle != nil {
		p, err := g.Throttle.Allow(r.attempts > 0)
		if err != nil {
			r.bp.Done(breaker.Ignored)
			s.res.Refused++
			return
		}
		r.ap = p
	}
	r.attempts++
	if !ready {
		// gRPC fails a call on a channel that is not ready at once
		// (without WaitForReady), and payment sees nothing.
		s.slice(t).Local++
		s.push(&event{kind: evAnswer, req: r, at: t, local: true})
		return
	}
	s.slice(t).Calls++
	e := &event{kind: evAnswer, req: r, at: t + s.sc.RTT}
	f, ok := s.fault(t)
	switch {
	case !ok:
		e.ok = true
	case f.Kind == Down:
	case f.Kind == Random:
		e.ok = s.rng.Float64() >= f.Value
	case f.Kind == Capacity:
		e.ok = s.take(t, f.Value*s.sc.Load)
	case f.Kind == Hang:
		e.timedOut = true
		e.at = r.deadline
		if d := s.sc.PerAttemptTimeout; d > 0 && t+d < r.deadline {
			e.at = t + d
		}
	}
	s.push(e)
}

// take takes one unit of payment's capacity of rate per second at t, in a
// bucket that holds 10 ms of it.
func (s *sim) take(t time.Duration, rate float64) bool {
	burst := max(1, rate*0.01)
	s.tokens = min(burst, s.tokens+(t-s.tokAt).Seconds()*rate)
	s.tokAt = t
	if s.tokens >= 1 {
		s.tokens--
		return true
	}
	return false
}

// answer settles an attempt and decides on a retry, as the interceptor's
// settle and next do.
func (s *sim) answer(e *event) {
	r, g, t := e.req, e.req.g, e.at
	if s.serving != nil && !e.local && !e.timedOut && s.serving.Record(e.ok) {
		s.healthChanged(t)
	}
	if e.ok {
		r.bp.Done(breaker.Success)
		r.ap.Done(adaptive.Accept)
		if g.Budget != nil {
			g.Budget.RecordOutcome(true)
		}
		if t <= r.deadline {
			s.slice(r.arrived).Successes++
		}
		return
	}
	callerDone := e.timedOut && t >= r.deadline
	if callerDone {
		// The caller's deadline: the simulator's breaker ignores it;
		// the throttle hears silence (a hang unless the target
		// answered others meanwhile), as the interceptor's does.
		r.bp.Done(breaker.Ignored)
		r.ap.Done(adaptive.Silence)
		return
	}
	r.bp.Done(breaker.Failure)
	r.ap.Done(adaptive.Overload)
	if g.Budget != nil {
		g.Budget.RecordOutcome(false)
	}
	if r.attempts >= s.st.Attempts {
		return
	}
	// Full jitter, 50 ms doubling, cap 1 s: the interceptor's default.
	ceil := min(50*time.Millisecond<<(r.attempts-1), time.Second)
	wait := time.Duration(s.rng.Float64() * float64(ceil))
	if t+wait >= r.deadline {
		return
	}
	if g.Breaker != nil && g.Breaker.State() == breaker.Open {
		return
	}
	if g.Throttle != nil && !g.Throttle.RetryAllowed() {
		return
	}
	if g.Budget != nil && !g.Budget.TryRetry() {
		return
	}
	r.prev = wait
	s.push(&event{at: t + wait, kind: evAttempt, req: r})
}

// restarted reports whether a Restart fault ended before t.
func (s *sim) restarted(t time.Duration) bool {
	for _, f := range s.sc.Faults {
		if f.Restart && t >= f.To {
			return true
		}
	}
	return false
}

// channelReady reports whether the replica's channel is ready at t: not
// broken by a restart, and, with Scenario.Health, payment serving as the
// channel last heard.
func (s *sim) channelReady(replica int, t time.Duration) bool {
	if s.ready != nil {
		f, ok := s.fault(t)
		if ok && f.Restart || t < s.ready[replica] && s.restarted(t) {
			return false
		}
	}
	for i := len(s.health) - 1; i >= 0; i-- {
		if h := s.health[i]; h.at+HealthDelay <= t {
			return h.serving
		}
	}
	return true
}

// healthChanged logs payment's new state at t and, when it stopped
// serving, schedules its trial.
func (s *sim) healthChanged(t time.Duration) {
	sv := s.serving.Serving()
	s.health = append(s.health, healthChange{at: t, serving: sv})
	if !sv {
		s.push(&event{at: t + s.serving.TrialIn(), kind: evTrial})
	}
}

// trial starts payment's health trial when it is due, as the timer of
// interceptor.WithHealth does.
func (s *sim) trial(t time.Duration) {
	if s.serving.Trial() {
		s.healthChanged(t)
	} else if d := s.serving.TrialIn(); d > 0 {
		s.push(&event{at: t + d, kind: evTrial})
	}
}
