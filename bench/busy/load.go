package busy

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/loadgen"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Sample is one user request: its start since the start of the load,
// how long it took and its code.
type Sample = loadgen.Sample

// Samples are the requests of one load.
type Samples = loadgen.Samples

// Result is what one load saw.
type Result struct {
	// Samples holds every request started, by start since the load's
	// start, answered or not.
	Samples Samples
	// Start is the load's start (the first request's, for ghz) on the
	// wall clock, which every process of the machine shares: where a
	// tier's times (Arrivals, a switch of FailAll) lie on the load's
	// time line.
	Start time.Time
	// Length is how long the load started requests for; requests in
	// flight at its end were waited for.
	Length time.Duration
	// Phases are an open-loop load's phases with the arrival rate each
	// reached.
	Phases []PhaseResult
	// Outage is what the outage scenario's schedule did; nil elsewhere.
	Outage *Outage
	// Payment is the arrivals series of every payment process, for the
	// scenarios whose figures cover a part of the run (overload); nil
	// elsewhere, where the calls at payment are the whole run's.
	Payment []Arrivals
}

// FixedLoad sends requests at a fixed concurrency: callers each send
// the next request the moment an answer comes, error or not, with no
// pause, as `ghz -c N` does, for d, and then wait for the answers in
// flight. deadline is each request's; 0 sends none (many Go callers
// send none). ctx bounds the whole load.
type FixedLoad interface {
	Name() string
	Fixed(ctx context.Context, addr string, callers int, d, deadline time.Duration) (Result, error)
	// Ramped is Fixed with the callers started as r says.
	Ramped(ctx context.Context, addr string, callers int, r Ramp, d, deadline time.Duration) (Result, error)
}

// Ramp starts the callers of a fixed-concurrency load over time, as a
// load test's ramp does (ghz --concurrency-schedule step, k6's ramping
// users): Start callers at once, then Step more every Every, up to all.
// The zero Ramp starts them all at once.
type Ramp struct {
	Start, Step int
	Every       time.Duration
}

// startOf returns when caller i (from 0) starts.
func (r Ramp) startOf(i int) time.Duration {
	if r.Step <= 0 || r.Every <= 0 || i < r.Start {
		return 0
	}
	return time.Duration((i-r.Start)/r.Step+1) * r.Every
}

// valid reports whether r is the zero Ramp or a ramp of callers.
func (r Ramp) valid(callers int) error {
	if r == (Ramp{}) {
		return nil
	}
	if r.Start <= 0 || r.Start > callers || r.Step <= 0 || r.Every <= 0 {
		return fmt.Errorf("ramp %+v of %d callers: want 0 < Start <= callers, Step > 0, Every > 0", r, callers)
	}
	return nil
}

// dial connects to addr with a plain client: no interceptor, no retry
// (a user's client, like ghz's).
func dial(addr string, conns int) ([]*grpc.ClientConn, error) {
	var cs []*grpc.ClientConn
	for range max(conns, 1) {
		c, err := grpc.NewClient("passthrough:///"+addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDisableRetry())
		if err != nil {
			closeAll(cs)
			return nil, err
		}
		c.Connect()
		cs = append(cs, c)
	}
	return cs, nil
}

func closeAll(cs []*grpc.ClientConn) {
	for _, c := range cs {
		_ = c.Close()
	}
}

// call sends one request with deadline (0: none, but ctx) and returns
// its sample, start measured from t0.
func call(ctx context.Context, cl testsvcv1.TestServiceClient, t0 time.Time, deadline time.Duration) Sample {
	cancel := context.CancelFunc(func() {})
	if deadline > 0 {
		ctx, cancel = context.WithTimeout(ctx, deadline)
	}
	begin := time.Now()
	_, err := cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: "load"})
	end := time.Now()
	cancel()
	return Sample{Start: begin.Sub(t0), Latency: end.Sub(begin), Code: status.Code(err)}
}

// GoLoad is the project's own fixed-concurrency load, in process (it
// needs nothing but Go; make test uses it).
type GoLoad struct {
	// Connections to the gateway, the callers spread over them; 0 is 1,
	// as ghz's default.
	Connections int
}

// Name implements FixedLoad.
func (GoLoad) Name() string { return "go" }

// Fixed implements FixedLoad.
func (g GoLoad) Fixed(ctx context.Context, addr string, callers int, d, deadline time.Duration) (Result, error) {
	return g.Ramped(ctx, addr, callers, Ramp{}, d, deadline)
}

// Ramped implements FixedLoad.
func (g GoLoad) Ramped(ctx context.Context, addr string, callers int, r Ramp, d, deadline time.Duration) (Result, error) {
	var length atomic.Int64
	length.Store(int64(d))
	return g.ramped(ctx, addr, callers, r, &length, deadline)
}

// FixedGrowing implements growingLoad: Fixed for as long as length says
// (nanoseconds), which another goroutine may raise while the load runs;
// the Result's Length is its last value.
func (g GoLoad) FixedGrowing(ctx context.Context, addr string, callers int, length *atomic.Int64, deadline time.Duration) (Result, error) {
	return g.ramped(ctx, addr, callers, Ramp{}, length, deadline)
}

// ramped is FixedGrowing with the callers started as r says.
func (g GoLoad) ramped(ctx context.Context, addr string, callers int, r Ramp, length *atomic.Int64, deadline time.Duration) (Result, error) {
	if d := time.Duration(length.Load()); callers <= 0 || d <= 0 {
		return Result{}, fmt.Errorf("fixed load: %d callers for %v: want both > 0", callers, d)
	}
	if err := r.valid(callers); err != nil {
		return Result{}, fmt.Errorf("fixed load: %w", err)
	}
	conns, err := dial(addr, g.Connections)
	if err != nil {
		return Result{}, err
	}
	defer closeAll(conns)
	per := make([]Samples, callers)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range callers {
		cl := testsvcv1.NewTestServiceClient(conns[i%len(conns)])
		wg.Go(func() {
			if wait := r.startOf(i); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
				}
			}
			for time.Since(t0) < time.Duration(length.Load()) && ctx.Err() == nil {
				per[i] = append(per[i], call(ctx, cl, t0, deadline))
			}
		})
	}
	wg.Wait()
	return Result{Samples: merge(per), Start: t0.Round(0), Length: time.Duration(length.Load())}, ctx.Err()
}

// growingLoad is a FixedLoad whose length can grow while it runs (see
// GoLoad.FixedGrowing): the outage scenario lengthens its load when the
// machine was too slow to keep the schedule.
type growingLoad interface {
	FixedGrowing(ctx context.Context, addr string, callers int, length *atomic.Int64, deadline time.Duration) (Result, error)
}

// merge returns the samples of every caller, by start.
func merge(per []Samples) Samples {
	var all Samples
	for _, s := range per {
		all = append(all, s...)
	}
	slices.SortFunc(all, byStart)
	return all
}

func byStart(a, b Sample) int { return cmp.Compare(a.Start, b.Start) }

// Phase is a stretch of an open-loop load: Rate arrivals per second for
// For.
type Phase struct {
	Rate float64
	For  time.Duration
}

// PhaseResult is a phase and what it reached: From is its start since
// the load's, Reached the arrivals per second that started in it.
type PhaseResult struct {
	Phase
	From    time.Duration
	Reached float64
}

// OpenLoop sends requests at the rates of phases, one after the other,
// each request in its own goroutine with deadline, whatever the chain
// answers: arrivals do not wait for answers. Arrivals are due from the
// load's start, so that a late wake-up sends what it owes at once. It
// returns when every request has ended.
func OpenLoop(ctx context.Context, addr string, phases []Phase, deadline time.Duration, conns int) (Result, error) {
	if len(phases) == 0 || deadline <= 0 {
		return Result{}, errors.New("open loop: want phases and a deadline")
	}
	var total time.Duration
	for _, p := range phases {
		if !(p.Rate > 0) || p.For <= 0 {
			return Result{}, fmt.Errorf("open loop: phase %+v: want a positive rate and length", p)
		}
		total += p.For
	}
	cs, err := dial(addr, conns)
	if err != nil {
		return Result{}, err
	}
	defer closeAll(cs)
	var (
		mu   sync.Mutex
		all  Samples
		wg   sync.WaitGroup
		sent int
	)
	t0 := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for ctx.Err() == nil {
		now := time.Since(t0)
		if now >= total {
			break
		}
		due, next := dueBy(phases, now)
		for ; sent < due; sent++ {
			cl := testsvcv1.NewTestServiceClient(cs[sent%len(cs)])
			wg.Go(func() {
				s := call(ctx, cl, t0, deadline)
				mu.Lock()
				all = append(all, s)
				mu.Unlock()
			})
		}
		timer.Reset(max(next-time.Since(t0), 50*time.Microsecond))
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	wg.Wait()
	slices.SortFunc(all, byStart)
	r := Result{Samples: all, Start: t0.Round(0), Length: total}
	var from time.Duration
	for _, p := range phases {
		n := len(all.Between(from, from+p.For))
		r.Phases = append(r.Phases, PhaseResult{Phase: p, From: from, Reached: float64(n) / p.For.Seconds()})
		from += p.For
	}
	return r, ctx.Err()
}

// dueBy returns the arrivals due by t since the start of phases, and
// when the next one is due.
func dueBy(phases []Phase, t time.Duration) (due int, next time.Duration) {
	var (
		from time.Duration
		owed float64 // arrivals of the phases before the current one
	)
	for _, p := range phases {
		if t < from+p.For {
			n := owed + p.Rate*(t-from).Seconds()
			due = int(n) + 1 // the arrival at the phase's start is due at once
			next = from + time.Duration((float64(due)-owed)/p.Rate*float64(time.Second))
			return due, next
		}
		from += p.For
		owed += p.Rate * p.For.Seconds()
	}
	return int(owed), from
}

// Ghz runs the ghz binary: the load users measure with.
type Ghz struct {
	Path string
	// Proto is the test service's .proto file, ImportPath its import
	// root (ghz compiles the file, no reflection needed).
	Proto, ImportPath string
	// Connections is ghz's --connections; 0 is its default, 1.
	Connections int
}

// Name implements FixedLoad.
func (Ghz) Name() string { return "ghz" }

// Fixed implements FixedLoad: ghz -c callers -z d, waiting for the
// requests in flight at the end (--duration-stop wait), with JSON
// output whose per-request details give every request's end, latency
// and status.
func (g Ghz) Fixed(ctx context.Context, addr string, callers int, d, deadline time.Duration) (Result, error) {
	return g.Ramped(ctx, addr, callers, Ramp{}, d, deadline)
}

// Ramped implements FixedLoad: Fixed, with ghz's step concurrency
// schedule for a ramp.
func (g Ghz) Ramped(ctx context.Context, addr string, callers int, r Ramp, d, deadline time.Duration) (Result, error) {
	if callers <= 0 || d <= 0 || deadline < 0 {
		return Result{}, fmt.Errorf("ghz: %d callers for %v, deadline %v: want callers and length > 0", callers, d, deadline)
	}
	if err := r.valid(callers); err != nil {
		return Result{}, fmt.Errorf("ghz: %w", err)
	}
	args := []string{
		"--insecure",
		"--proto", g.Proto, "--import-paths", g.ImportPath,
		"--call", "stormguard.testsvc.v1.TestService.Unary",
		"-d", `{"id":"ghz"}`,
		"-c", strconv.Itoa(callers),
		"-z", d.String(),
		// 0 is "no deadline" for ghz (its default is 20 s).
		"--timeout", deadline.String(),
		"--duration-stop", "wait",
		"--connections", strconv.Itoa(max(g.Connections, 1)),
		"-O", "json",
	}
	if r != (Ramp{}) {
		args = append(args, "--concurrency-schedule", "step",
			"--concurrency-start", strconv.Itoa(r.Start), "--concurrency-step", strconv.Itoa(r.Step),
			"--concurrency-step-duration", r.Every.String(), "--concurrency-end", strconv.Itoa(callers))
	}
	args = append(args, addr)
	// Generous: with no deadline a hung request would hold ghz forever.
	ctx, cancel := context.WithTimeout(ctx, d+deadline+2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.Path, args...)
	var out bytes.Buffer
	errs := &tailWriter{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = &out, errs
	if err := cmd.Run(); err != nil {
		// ghz exits 1 when requests failed; a report on stdout is
		// still a result.
		if out.Len() == 0 {
			return Result{}, fmt.Errorf("ghz: %w: %s", err, errs)
		}
	}
	s, t0, err := parseGhz(out.Bytes())
	if err != nil {
		return Result{}, err
	}
	return Result{Samples: s, Start: t0, Length: d}, nil
}

// ghzReport is the part of ghz's JSON report the harness reads.
type ghzReport struct {
	Count   uint64 `json:"count"`
	Details []struct {
		Timestamp time.Time     `json:"timestamp"` // the request's end
		Latency   time.Duration `json:"latency"`
		Status    string        `json:"status"`
	} `json:"details"`
}

// codeByName maps codes.Code.String() (what ghz reports) to the code.
var codeByName = func() map[string]codes.Code {
	m := map[string]codes.Code{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		m[c.String()] = c
	}
	return m
}()

// parseGhz returns the samples of a ghz JSON report, by start since
// the first start, and that start (wall clock).
func parseGhz(b []byte) (Samples, time.Time, error) {
	var r ghzReport
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, time.Time{}, fmt.Errorf("ghz report: %w", err)
	}
	if uint64(len(r.Details)) != r.Count {
		return nil, time.Time{}, fmt.Errorf("ghz report: %d details for %d requests (ghz keeps at most 1 000 000)", len(r.Details), r.Count)
	}
	if len(r.Details) == 0 {
		return nil, time.Time{}, errors.New("ghz report: no requests")
	}
	starts := make([]time.Time, len(r.Details))
	t0 := r.Details[0].Timestamp
	for i, d := range r.Details {
		starts[i] = d.Timestamp.Add(-d.Latency)
		if starts[i].Before(t0) {
			t0 = starts[i]
		}
	}
	s := make(Samples, len(r.Details))
	for i, d := range r.Details {
		code, ok := codeByName[d.Status]
		if !ok {
			code = codes.Unknown // an error without a status
		}
		s[i] = Sample{Start: starts[i].Sub(t0), Latency: d.Latency, Code: code}
	}
	slices.SortFunc(s, byStart)
	return s, t0, nil
}
