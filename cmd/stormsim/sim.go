package main

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// simConfig is what the demo runs, per mode.
type simConfig struct {
	rate        int           // open-loop user requests per second in the sustained phase
	duration    time.Duration // of the sustained phase
	users       int           // closed-loop users, after the sustained phase and in recovery
	usersFor    time.Duration // of the closed-loop phase
	flaky       float64       // > 0: payment fails at random instead of being killed
	seed        uint64
	maxRecovery time.Duration // how long the recovery phase waits
	tail        time.Duration // how long the load goes on after recovery, for the chart
}

// sampleEvery is the interval at which calls at payment are sampled for
// the chart and the progress line.
const sampleEvery = 100 * time.Millisecond

// sample is the number of calls sent to payment from the start of a mode
// (payment's kill) up to t.
type sample struct {
	t     time.Duration
	calls int64
}

// result is one mode's row: the field names are the --json format.
type result struct {
	Mode   string       `json:"mode"`
	Single singleCounts `json:"single"`
	// Sustained is the open-loop phase, ClosedLoop the users after it.
	Sustained  phaseStats `json:"sustained"`
	ClosedLoop phaseStats `json:"closed_loop"`
	RecoveryMS int64      `json:"recovery_ms"` // -1: not within the limit

	// For the chart: calls at payment over time since the kill, when the
	// closed-loop users started and when payment came back.
	series    []sample
	usersAt   time.Duration
	restartAt time.Duration
}

// singleCounts are the calls one user request caused, per tier.
type singleCounts struct {
	Gateway int64 `json:"gateway"`
	Order   int64 `json:"order"`
	Payment int64 `json:"payment"`
}

// phaseStats are what the users of a phase of load saw, and what it cost
// payment: Rate is set for the open loop, Users for the closed loop.
type phaseStats struct {
	Rate           int     `json:"rate,omitempty"`  // requests sent per second
	Users          int     `json:"users,omitempty"` // users, each waiting for its answer
	DurationMS     int64   `json:"duration_ms"`     // of sending
	Requests       int64   `json:"requests"`
	CallsPerSecond float64 `json:"calls_per_second"` // calls at payment per second of sending
	Amplification  float64 `json:"amplification"`    // calls at payment per user request
	Success        float64 `json:"success"`          // share of requests that succeeded, 0 to 1
	P50MS          float64 `json:"p50_ms"`
	P99MS          float64 `json:"p99_ms"`
}

// progress hears what the simulation is doing, for the live line.
type progress interface {
	phase(mode, phase string)
	update(requests, ok, paymentCalls int64)
}

type noProgress struct{}

func (noProgress) phase(string, string)       {}
func (noProgress) update(int64, int64, int64) {}

// simulate runs every mode in turn.
func simulate(ctx context.Context, cfg simConfig, ms []mode, p progress) ([]result, error) {
	var out []result
	for _, m := range ms {
		r, err := runMode(ctx, cfg, m, p)
		if err != nil {
			return out, fmt.Errorf("%s: %w", m.name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// runMode puts m on every process of a fresh in-process chain, breaks
// payment, and runs the four phases: one request, the sustained open
// loop, the closed-loop users, and recovery.
func runMode(ctx context.Context, cfg simConfig, m mode, p progress) (res result, err error) {
	res = result{Mode: m.name, RecoveryMS: -1}
	chain, err := startChain(m, cfg.seed)
	if err != nil {
		return res, err
	}
	defer chain.Close()
	pay := chain.Tier("payment")
	client := chain.Client()

	// Payment breaks at t0; the sampler records calls at payment from
	// then on.
	t0 := time.Now()
	if cfg.flaky > 0 {
		pay.SetFlaky(cfg.flaky)
	} else {
		pay.Kill()
	}
	var (
		rec    *recorder // the current phase's, for the progress line
		recMu  sync.Mutex
		series []sample
	)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	sampling.Go(func() {
		ticker := time.NewTicker(sampleEvery)
		defer ticker.Stop()
		for {
			calls := pay.Attempts(testsvc.Unary)
			series = append(series, sample{t: time.Since(t0), calls: calls})
			recMu.Lock()
			r := rec
			recMu.Unlock()
			if r != nil {
				p.update(r.requests(), r.ok.Load(), calls)
			} else {
				p.update(0, 0, calls)
			}
			select {
			case <-sampleCtx.Done():
				return
			case <-ticker.C:
			}
		}
	})
	defer func() {
		stopSampling()
		sampling.Wait()
		res.series = append(series, sample{t: time.Since(t0), calls: pay.Attempts(testsvc.Unary)})
	}()
	setRec := func(r *recorder) {
		recMu.Lock()
		rec = r
		recMu.Unlock()
	}

	// Phase 1: one user request.
	p.phase(m.name, "1 request")
	res.Single = oneRequest(ctx, chain)
	if err := ctx.Err(); err != nil {
		return res, err
	}

	// Phase 2: sustained open-loop load, then let the requests in flight
	// finish, so that every request's calls at payment are counted.
	p.phase(m.name, fmt.Sprintf("%d req/s", cfg.rate))
	sustained := &recorder{}
	setRec(sustained)
	before := pay.Attempts(testsvc.Unary)
	a := startArrivals(client, cfg.rate, cfg.duration, sustained)
	select {
	case <-a.sent:
	case <-ctx.Done():
		a.stop()
		return res, ctx.Err()
	}
	a.drain()
	res.Sustained = stats(sustained, pay.Attempts(testsvc.Unary)-before, cfg.duration)
	res.Sustained.Rate = cfg.rate

	// Phase 3: closed-loop users, each waiting for its answer, then the
	// same drain.
	p.phase(m.name, fmt.Sprintf("%d users", cfg.users))
	closed := &recorder{}
	setRec(closed)
	res.usersAt = time.Since(t0)
	before = pay.Attempts(testsvc.Unary)
	u := startUsers(client, cfg.users, closed)
	if !waitFor(ctx, cfg.usersFor) {
		u.stop()
		return res, ctx.Err()
	}
	u.drain()
	res.ClosedLoop = stats(closed, pay.Attempts(testsvc.Unary)-before, cfg.usersFor)
	res.ClosedLoop.Users = cfg.users

	// Phase 4: payment comes back; how long until users succeed again?
	p.phase(m.name, "recovery")
	recovery := &recorder{}
	setRec(recovery)
	restart := time.Now()
	res.restartAt = restart.Sub(t0)
	if cfg.flaky > 0 {
		pay.SetFlaky(0)
	} else {
		pay.Restart()
	}
	u = startUsers(client, cfg.users, recovery)
	d := recoveryWatch(ctx, recovery, restart, cfg.maxRecovery)
	if d >= 0 {
		res.RecoveryMS = d.Milliseconds()
		waitFor(ctx, cfg.tail)
	}
	u.stop()
	return res, ctx.Err()
}

// startChain starts an in-process chain with m on every process.
func startChain(m mode, seed uint64) (*testsvc.Chain, error) {
	stacks, err := buildStacks(func(int) (stack, error) { return m.process(nil) })
	if err != nil {
		return nil, err
	}
	return startStacks(seed, stacks)
}

// buildStacks returns the stacks of the processes of an in-process chain,
// stackOf(i) for process i: process 0 is the edge client, process i > 0
// tier i-1 (see startStacks).
func buildStacks(stackOf func(proc int) (stack, error)) ([]stack, error) {
	stacks := make([]stack, len(testsvc.DefaultTiers)+1)
	for i := range stacks {
		var err error
		if stacks[i], err = stackOf(i); err != nil {
			return nil, err
		}
	}
	return stacks, nil
}

// startStacks starts an in-process chain with the stacks of buildStacks:
// the dial options of process i go on the connection it makes (hop i),
// its server options on its server (tier i-1); the last tier makes no
// connection, and the edge client has no server.
func startStacks(seed uint64, stacks []stack) (*testsvc.Chain, error) {
	return testsvc.Start(testsvc.Config{
		DialOptions:   func(hop int) []grpc.DialOption { return stacks[hop].dial },
		ServerOptions: func(tier int) []grpc.ServerOption { return stacks[tier+1].server },
		Seed:          seed,
	})
}

// stats summarizes a phase whose requests rec holds and which caused
// calls at payment while it sent for d.
func stats(rec *recorder, calls int64, d time.Duration) phaseStats {
	s := summarize(rec.since(0))
	st := phaseStats{
		DurationMS:     d.Milliseconds(),
		Requests:       int64(s.requests),
		CallsPerSecond: round(float64(calls)/d.Seconds(), 1),
		Success:        round(s.success, 4),
		P50MS:          ms(s.p50),
		P99MS:          ms(s.p99),
	}
	if s.requests > 0 {
		st.Amplification = round(float64(calls)/float64(s.requests), 3)
	}
	return st
}

// oneRequest sends one user request through the chain and returns the
// calls it caused at each tier, counted from the chain's start.
func oneRequest(ctx context.Context, chain *testsvc.Chain) singleCounts {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, _ = chain.Client().Unary(ctx, &testsvcv1.UnaryRequest{Id: "one"})
	return singleCounts{
		Gateway: chain.Tier("gateway").Received(testsvc.Unary),
		Order:   chain.Tier("order").Received(testsvc.Unary),
		// A killed payment receives nothing: count what order sent it.
		Payment: chain.Tier("payment").Attempts(testsvc.Unary),
	}
}

// waitFor waits for d, or until ctx ends; it reports whether d passed.
func waitFor(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 2) }

func round(x float64, digits int) float64 {
	f := math.Pow(10, float64(digits))
	return math.Round(x*f) / f
}
