package busy

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Work is what a tier does with each unary request of the test service
// before its handler forwards it (payment: answers it). The zero Work
// does nothing. The steps run in the order of the fields: a failure
// answers at once, before any work (a database that refuses the
// connection); then the wait, the worker pool and the CPU.
type Work struct {
	// FailAll answers every request UNAVAILABLE: the tier is alive, its
	// connections are ready, and it cannot serve anything. It is the
	// state the tier starts in; its stats port switches it (POST
	// /fail-all?on=1, and on=0 to end it).
	FailAll bool
	// Fail answers each request UNAVAILABLE with probability Fail, in
	// [0, 1]; 0 never.
	Fail float64
	// Wait is slept on every request (a dependency that takes Wait, with
	// no queue); it ends early when the caller leaves. 0: none.
	Wait time.Duration
	// Workers and Hold are a worker pool: each request waits, in FIFO
	// order, for one of Workers workers (leaving the queue when its
	// caller leaves) and holds it for Hold, whatever the caller does
	// meanwhile (the work, once started, is done). Capacity is
	// Workers/Hold. Both 0: no pool; both or neither must be set.
	Workers int
	Hold    time.Duration
	// Spread makes Wait and Hold the means of exponentially distributed
	// times, drawn for each request: a dependency or a database whose
	// latency spreads, as most do, rather than one that always takes
	// the same time.
	Spread bool
	// CPU is the units of busy loop burnt on every request (see
	// Calibrate: the units that take a given time on this machine).
	// 0: none.
	CPU int64
	// Slow is the share of requests, in [0, 1], that wait SlowWait
	// instead of Wait (slow requests next to fast ones: a report, a
	// batch, next to cache hits); each slow request's wait is drawn
	// uniformly between half and one and a half times SlowWait. The
	// tier's stats port switches the share (POST /slow?share=p).
	Slow     float64
	SlowWait time.Duration
}

// Validate reports a Work that cannot run, naming the tier flag.
func (w Work) Validate() error {
	switch {
	case !(w.Fail >= 0 && w.Fail <= 1):
		return fmt.Errorf("--fail %v: want a probability in [0, 1]", w.Fail)
	case w.Wait < 0:
		return fmt.Errorf("--wait %v: want >= 0", w.Wait)
	case w.Workers < 0 || w.Hold < 0:
		return fmt.Errorf("--workers %d --hold %v: want >= 0", w.Workers, w.Hold)
	case (w.Workers > 0) != (w.Hold > 0):
		return fmt.Errorf("--workers %d --hold %v: a pool needs both", w.Workers, w.Hold)
	case w.CPU < 0:
		return fmt.Errorf("--cpu-units %d: want >= 0", w.CPU)
	case !(w.Slow >= 0 && w.Slow <= 1):
		return fmt.Errorf("--slow %v: want a share in [0, 1]", w.Slow)
	case w.SlowWait < 0:
		return fmt.Errorf("--slow-wait %v: want >= 0", w.SlowWait)
	}
	return nil
}

// register binds w's fields to the tier's flags.
func (w *Work) register(fs *flag.FlagSet) {
	fs.BoolVar(&w.FailAll, "fail-all", false, "answer every request UNAVAILABLE (alive, but cannot serve)")
	fs.Float64Var(&w.Fail, "fail", 0, "answer each request UNAVAILABLE with `probability` p, at once")
	fs.DurationVar(&w.Wait, "wait", 0, "sleep this `long` per request (ends when the caller leaves)")
	fs.IntVar(&w.Workers, "workers", 0, "serve from this `many` workers (FIFO queue; needs --hold)")
	fs.DurationVar(&w.Hold, "hold", 0, "each request holds a worker this `long` (needs --workers)")
	fs.BoolVar(&w.Spread, "spread", false, "make --wait and --hold the means of exponentially distributed times")
	fs.Int64Var(&w.CPU, "cpu-units", 0, "burn this `many` units of busy loop per request (see --cpu)")
	fs.Float64Var(&w.Slow, "slow", 0, "make this `share` of requests wait about --slow-wait instead of --wait")
	fs.DurationVar(&w.SlowWait, "slow-wait", 0, "a slow request waits between half and 1.5 times this `long`")
}

// Args returns the tier flags that make a tier do w.
func (w Work) Args() []string {
	var a []string
	if w.FailAll {
		a = append(a, "--fail-all")
	}
	if w.Fail > 0 {
		a = append(a, "--fail", strconv.FormatFloat(w.Fail, 'g', -1, 64))
	}
	if w.Wait > 0 {
		a = append(a, "--wait", w.Wait.String())
	}
	if w.Workers > 0 {
		a = append(a, "--workers", strconv.Itoa(w.Workers), "--hold", w.Hold.String())
	}
	if w.Spread {
		a = append(a, "--spread")
	}
	if w.CPU > 0 {
		a = append(a, "--cpu-units", strconv.FormatInt(w.CPU, 10))
	}
	if w.Slow > 0 {
		a = append(a, "--slow", strconv.FormatFloat(w.Slow, 'g', -1, 64))
	}
	if w.SlowWait > 0 {
		a = append(a, "--slow-wait", w.SlowWait.String())
	}
	return a
}

// worker does a Work for every request of a tier.
type worker struct {
	w       Work
	failAll atomic.Bool   // Work.FailAll, switched by setFailAll
	slow    atomic.Uint64 // Work.Slow's bits, switched by setSlow
	slots   chan struct{} // the pool: one token per busy worker
	rngMu   sync.Mutex
	rng     *rand.Rand
	// handled counts the requests that reached the handler (past every
	// interceptor of the stack), ok those the tier answered OK.
	handled, ok atomic.Int64
}

func newWorker(w Work, seed uint64) *worker {
	k := &worker{w: w, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	k.failAll.Store(w.FailAll)
	k.slow.Store(math.Float64bits(w.Slow))
	if w.Workers > 0 {
		k.slots = make(chan struct{}, w.Workers)
	}
	return k
}

var errDown = status.Error(codes.Unavailable, "busy: this tier cannot serve (its database is down)")

// do runs the work of one request; a non-nil error is the request's
// answer.
func (k *worker) do(ctx context.Context) error {
	if k.failAll.Load() {
		return errDown
	}
	if k.w.Fail > 0 {
		k.rngMu.Lock()
		fail := k.rng.Float64() < k.w.Fail
		k.rngMu.Unlock()
		if fail {
			return status.Error(codes.Unavailable, "busy: random failure")
		}
	}
	wait, hold := k.times()
	if err := sleep(ctx, wait); err != nil {
		return err
	}
	if k.slots != nil {
		// A channel's blocked senders are served in the order they came:
		// a FIFO queue for a worker.
		select {
		case k.slots <- struct{}{}:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
		held := time.NewTimer(hold)
		<-held.C
		<-k.slots
	}
	if k.w.CPU > 0 {
		sink.Store(spin(k.w.CPU))
	}
	return nil
}

// times returns how long one request waits and holds its worker: Wait
// and Hold, or with Spread, times drawn from exponential distributions
// of those means; a slow request (the share Slow) waits SlowWait
// instead, give or take half of it.
func (k *worker) times() (wait, hold time.Duration) {
	wait, hold = k.w.Wait, k.w.Hold
	share := math.Float64frombits(k.slow.Load())
	if !k.w.Spread && share == 0 {
		return wait, hold
	}
	k.rngMu.Lock()
	defer k.rngMu.Unlock()
	if k.w.Spread {
		wait = time.Duration(k.rng.ExpFloat64() * float64(wait))
		hold = time.Duration(k.rng.ExpFloat64() * float64(hold))
	}
	if share > 0 && k.rng.Float64() < share {
		wait = time.Duration((0.5 + k.rng.Float64()) * float64(k.w.SlowWait))
	}
	return wait, hold
}

// setSlow switches the share of slow requests (Work.Slow), share in
// [0, 1].
func (k *worker) setSlow(share float64) { k.slow.Store(math.Float64bits(share)) }

// setFailAll switches FailAll and returns when it did, so that a
// caller can sort requests by it: turned on, every request that reaches
// the work after the time returned fails; turned off, every request
// answered before it failed (the clock is read after the switch on,
// before the switch off).
func (k *worker) setFailAll(on bool) time.Time {
	if on {
		k.failAll.Store(true)
		return time.Now()
	}
	at := time.Now()
	k.failAll.Store(false)
	return at
}

// unary is the tier's innermost server interceptor: the work, then the
// handler. Only the test service's unary calls work; the health service
// and the stats service pass.
func (k *worker) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if info.FullMethod != testsvcv1.TestService_Unary_FullMethodName {
		return h(ctx, req)
	}
	k.handled.Add(1)
	if err := k.do(ctx); err != nil {
		return nil, err
	}
	resp, err := h(ctx, req)
	if err == nil {
		k.ok.Add(1)
	}
	return resp, err
}

// sleep waits d or until ctx ends, whichever is first; it returns the
// status of a context that ended.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// sink keeps spin's result, so that the compiler cannot drop the loop.
var sink atomic.Uint64

// spin burns n units of CPU: one xorshift step each, every step
// depending on the last.
func spin(n int64) uint64 {
	x := uint64(n) | 1
	for range n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}

// Calibrate returns the units of busy loop (Work.CPU) that take d of CPU
// on this machine: the fastest of several trials, the one least
// disturbed by other processes. Calibrate once, with the machine quiet,
// and pass the units to every tier, so that every run burns the same
// work.
func Calibrate(d time.Duration) (int64, error) {
	if d <= 0 {
		return 0, errors.New("calibrate: want a positive duration")
	}
	const probe = 1 << 22
	best := time.Duration(math.MaxInt64)
	for range 9 {
		t0 := time.Now()
		sink.Store(spin(probe))
		best = min(best, time.Since(t0))
	}
	return max(1, int64(float64(probe)*float64(d)/float64(max(best, 1)))), nil
}
