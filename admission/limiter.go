package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

// Defaults for the zero fields of [Config].
const (
	DefaultInitialLimit = 20
	DefaultMinLimit     = 16
	DefaultMaxLimit     = 1000
	DefaultTolerance    = 2.0
	DefaultWindow       = 50 * time.Millisecond
	DefaultRetryShare   = 0.5
	DefaultQueueTimeout = 100 * time.Millisecond
	DefaultQueueTarget  = 5 * time.Millisecond

	// MinWindow and MaxWindow bound Config.Window.
	MinWindow = time.Millisecond
	MaxWindow = 10 * time.Second
	// MaxTolerance bounds Config.Tolerance.
	MaxTolerance = 10.0
)

// The constants of the gradient algorithm.
const (
	// minSamples is the number of latencies a window needs before it
	// ends; a window of slowWindows x Window ends with any number.
	minSamples  = 4
	slowWindows = 4
	// probeEvery is the number of windows between two probes of the
	// latency without a queue, while the limit is in use.
	probeEvery = 10
	// probeTimeout is the longest probe, in windows.
	probeTimeout = 8
	// smoothUp and smoothDown are the weights of each window's new limit
	// in the limit, when it is higher and when it is lower.
	smoothUp   = 0.2
	smoothDown = 0.5
	// minGradient bounds the cut per window: the new limit is at least
	// half the old one before smoothing, so at most 25 % lower after it.
	minGradient = 0.5
	// maxGradient bounds the growth per window: latency at base with the
	// default Tolerance gives 2, 20 % more after smoothing.
	maxGradient = 2
)

// ErrInvalidConfig is wrapped by the error New returns for an invalid
// Config. Check it with errors.Is.
var ErrInvalidConfig = errors.New("admission: invalid config")

// The reasons a request is refused, returned by Acquire. Check them with
// errors.Is.
var (
	// ErrLimit: the requests in flight have reached the limit for the
	// request's class.
	ErrLimit = errors.New("admission: concurrency limit reached")
	// ErrDeadline: the request's remaining deadline is shorter than the
	// latency the server currently needs.
	ErrDeadline = errors.New("admission: deadline shorter than the current latency")
)

// Clock tells the time; clock.Real and clock.Fake from this module satisfy
// it. Durations are taken as Now().Sub(start), so a clock whose readings
// carry Go's monotonic component (time.Now does) is immune to wall-clock
// jumps.
type Clock interface {
	Now() time.Time
}

// Class is the value of a request to its caller, which decides the order
// in which requests are shed: under overload, retries go first, then the
// first attempts of callers that are already retrying, first attempts
// last.
type Class int

// The classes, from the most valuable.
const (
	// ClassFirst is a first attempt from a caller that is not retrying.
	// It may use the whole limit.
	ClassFirst Class = iota
	// ClassUpstreamRetrying is a first attempt from a caller that is
	// serving a retry of its own caller (x-upstream-retries > 0). It may
	// use half-way between the retry share and the whole limit.
	ClassUpstreamRetrying
	// ClassRetry is a retry (x-retry-attempt >= 1 or
	// grpc-previous-rpc-attempts >= 1). It may use Config.RetryShare of
	// the limit.
	ClassRetry
	numClasses
)

var classNames = [numClasses]string{"first", "upstream_retrying", "retry"}

func (c Class) String() string {
	if c >= 0 && c < numClasses {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// ClassOf returns the class of a request from its caller's attempt index
// (0 for a first attempt) and the number of retries in progress above it.
func ClassOf(attempt, upstreamRetries int) Class {
	switch {
	case attempt > 0:
		return ClassRetry
	case upstreamRetries > 0:
		return ClassUpstreamRetrying
	}
	return ClassFirst
}

// Config configures a [Limiter]. The zero value of every field means its
// default, so Config{} is a valid configuration.
type Config struct {
	// InitialLimit is the limit before any latency was measured. Zero
	// means DefaultInitialLimit (20). Valid: MinLimit <= InitialLimit <=
	// MaxLimit.
	InitialLimit int
	// MinLimit is the floor of the limit and of its probes. Set it near
	// the number of requests the server serves at once (its workers):
	// below, a server that became slow rather than queued serves under
	// its capacity; far above, up to about twice MinLimit requests may
	// wait in a queue inside the server (the deadline rule still refuses
	// those that would miss their deadline). Zero means DefaultMinLimit
	// (16). Valid: >= 1.
	MinLimit int
	// MaxLimit is the ceiling of the limit. Zero means DefaultMaxLimit
	// (1000). Valid: >= MinLimit.
	MaxLimit int
	// Tolerance is how much the recent latency may exceed the long-term
	// latency before the limit falls: 2 tolerates a queue as long as the
	// service time. Zero means DefaultTolerance (2). Valid: 1 to
	// MaxTolerance (10).
	Tolerance float64
	// Window is how often the limit is updated: at the end of each window
	// with at least 4 latencies (or 4 windows with fewer). Zero means
	// DefaultWindow (50 ms). Valid: MinWindow (1 ms) to MaxWindow (10 s).
	Window time.Duration
	// RetryShare is the share of the limit that retries may use (see
	// Class). Zero means DefaultRetryShare (0.5). Valid: 0 < RetryShare
	// <= 1; 1 sheds retries no earlier than first attempts.
	RetryShare float64
	// QueueSize is the number of requests that may wait in Wait for a
	// slot when the limit for their class is full (see Limiter.Wait).
	// Zero means no queue: such a request is refused at once. Valid: >= 0.
	QueueSize int
	// QueueTimeout is the longest wait in the queue, and how long the
	// queue must have stayed non-empty to count as backed up (CoDel's
	// interval). Zero means DefaultQueueTimeout (100 ms). Valid: >= 0.
	QueueTimeout time.Duration
	// QueueTarget is the longest wait once the queue is backed up
	// (CoDel's target). Zero means DefaultQueueTarget (5 ms), or
	// QueueTimeout when shorter. Valid: 0 <= QueueTarget <= QueueTimeout.
	QueueTarget time.Duration
	// Clock is the time source. Nil means the system clock. The queue's
	// timeouts use the clock's AfterFunc when it has one (see Timers),
	// time.AfterFunc otherwise.
	Clock Clock
}

func (c *Config) resolve() error {
	switch {
	case c.MinLimit < 0:
		return invalidf("MinLimit %d is negative", c.MinLimit)
	case c.MaxLimit < 0:
		return invalidf("MaxLimit %d is negative", c.MaxLimit)
	case c.InitialLimit < 0:
		return invalidf("InitialLimit %d is negative", c.InitialLimit)
	case math.IsNaN(c.Tolerance) || c.Tolerance != 0 && (c.Tolerance < 1 || c.Tolerance > MaxTolerance):
		return invalidf("Tolerance %v out of range [1, %v]", c.Tolerance, MaxTolerance)
	case c.Window != 0 && (c.Window < MinWindow || c.Window > MaxWindow):
		return invalidf("Window %v out of range [%v, %v]", c.Window, MinWindow, MaxWindow)
	case math.IsNaN(c.RetryShare) || c.RetryShare < 0 || c.RetryShare > 1:
		return invalidf("RetryShare %v out of range (0, 1]", c.RetryShare)
	}
	if err := c.resolveQueue(); err != nil {
		return err
	}
	orDefault(&c.MinLimit, DefaultMinLimit)
	if c.MaxLimit == 0 {
		c.MaxLimit = max(DefaultMaxLimit, c.MinLimit)
	}
	if c.InitialLimit == 0 {
		c.InitialLimit = min(max(DefaultInitialLimit, c.MinLimit), c.MaxLimit)
	}
	switch {
	case c.MaxLimit < c.MinLimit:
		return invalidf("MaxLimit %d below MinLimit %d", c.MaxLimit, c.MinLimit)
	case c.InitialLimit < c.MinLimit || c.InitialLimit > c.MaxLimit:
		return invalidf("InitialLimit %d out of range [%d, %d]", c.InitialLimit, c.MinLimit, c.MaxLimit)
	}
	orDefault(&c.Tolerance, DefaultTolerance)
	orDefault(&c.Window, DefaultWindow)
	orDefault(&c.RetryShare, DefaultRetryShare)
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return nil
}

// Limiter is an adaptive concurrency limit. Acquire admits a request when
// the requests in flight are below the limit for its class, and the
// Permit's Release reports its latency.
//
// The limit follows a gradient: at the end of each window (Config.Window,
// 50 ms) the window's mean latency (short) is compared with the latency
// without a queue (base), and
//
//	gradient = clamp(Tolerance x base / short, 0.5, 2)
//	next     = limit x gradient + max(1, log10(limit))
//	limit    = limit + 0.2 x (next - limit) when next is higher, 0.5 x when lower
//
// So the limit settles where the queue is (Tolerance - 1) times the
// service, plus one or two; it grows while latency is below that, by up
// to 20 % per window plus about 0.2 with the default Tolerance, but
// only while the server uses at least half of it; and when a queue builds
// up it falls by up to 25 % per window: from 100 to 10 in 8 windows,
// 400 ms. When latency recovers, short falls below base, base follows it
// at once, and the limit grows again: from 10 to 30 in about 10 windows.
//
// Base is the lowest window mean, refreshed by a probe when the latency
// was above Tolerance x base for two windows in a row while the limit is
// in use (at most every 10 windows): the limit is cut to a quarter (not below MinLimit) until the
// requests in flight are down to it, and the mean latency of the next few
// requests becomes base. The probe drains the queue, so base measures the
// service time and not a standing queue (without it, base would drift up
// with the queue and the limit with it, the known weakness of Gradient2);
// and a server that became slower, not queued, gets its limit back within
// one probe. A probe ends after 8 windows at most. A server whose latency
// stays near base never probes.

// Classes: a first attempt may use the whole limit, a retry RetryShare of
// it, and a caller already retrying half-way between, so under overload,
// when the limit is full, retries are refused first.
//
// Deadlines: a request is refused, while other requests are in flight,
// when its remaining deadline is shorter than the latency it can expect:
// the least latency of the last window, or, when longer, the requests in
// flight (itself included) times the busy time per request finished in
// the last window (Little's law: what a FIFO server needs to reach it).
// Busy time is the time the server had requests in flight, bounded above
// by both the window's length and the sum of its latencies: on a busy
// server it is the window, so the time per request is one over the
// throughput; on a quiet one it is the service time, not the gap between
// arrivals. The estimate is used only while it is fresh: with nothing in
// flight, or when no measured request ended for 4 windows (refused
// requests measure nothing, and requests that stay in flight a long time
// could otherwise keep a stale estimate refusing everything), the request
// is admitted and the next window measures again.
//
// Queue: with Config.QueueSize, Wait lets a request that meets a full
// limit wait for a slot, briefly (CoDel and adaptive LIFO, see Wait).
// Without it (the default) such a request is refused at once.
//
// Acquire and Release allocate nothing; Acquire takes no lock, Release
// takes one mutex briefly (and the queue's, while requests wait). A
// Limiter must be created with New.
type Limiter struct {
	clk      Clock
	sys      bool // clk is the system clock: use time.Since
	origin   time.Time
	cfg      Config
	retryPM  int64 // Config.RetryShare x 1000
	middlePM int64 // half-way between retryPM and 1000

	_        [64]byte
	inflight atomic.Int64
	limit    atomic.Int64
	needed   atomic.Int64 // nanoseconds: the least latency of the last window
	perDone  atomic.Int64 // nanoseconds of busy time per request finished in the last window
	waiting  atomic.Int64 // requests in the queue or about to enter it
	lastDone atomic.Int64 // nanoseconds since origin: when a measured request last ended
	_        [16]byte     // the six counters above and this fill one 64-byte line
	rejected [numReasons]atomic.Int64

	q queue

	mu          sync.Mutex
	winStart    int64 // nanoseconds since origin; -1 before the first sample
	sum, count  int64
	least       int64
	maxInflight int64
	windows     int     // windows since the last probe
	wasQueued   bool    // the last window's latency was above Tolerance x base
	base        float64 // nanoseconds: the latency without a queue
	est         float64 // the limit, before rounding down

	probing    bool
	probeStart int64 // nanoseconds since origin
	probeLimit int64
	drainedAt  int64 // when the queue from before the probe had gone; -1 before
	psum, pn   int64 // latencies of requests admitted after drainedAt
}

// reason indexes the rejection counters.
type reason int

const (
	reasonLimit reason = iota
	reasonDeadline
	reasonQueue
	numReasons
)

// New returns a Limiter for cfg, or an error wrapping ErrInvalidConfig that
// names the offending field.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	l := &Limiter{
		clk:      cfg.Clock,
		cfg:      cfg,
		retryPM:  int64(math.Round(cfg.RetryShare * 1000)),
		winStart: -1,
		est:      float64(cfg.InitialLimit),
	}
	l.middlePM = (l.retryPM + 1000) / 2
	_, l.sys = l.clk.(clock.Real)
	l.origin = l.clk.Now()
	l.limit.Store(int64(cfg.InitialLimit))
	return l, nil
}

// Config returns the configuration with defaults filled in.
func (l *Limiter) Config() Config { return l.cfg }

// now returns the time since origin in nanoseconds, and the time.
func (l *Limiter) now() (int64, time.Time) {
	if l.sys {
		t := time.Now()
		return int64(t.Sub(l.origin)), t
	}
	t := l.clk.Now()
	return int64(t.Sub(l.origin)), t
}

// classLimit returns the number of requests in flight below which a
// request of class c is admitted.
func (l *Limiter) classLimit(c Class, limit int64) int64 {
	switch c {
	case ClassRetry:
		return max(limit*l.retryPM/1000, 1)
	case ClassUpstreamRetrying:
		return max(limit*l.middlePM/1000, 1)
	}
	return limit
}

// Acquire admits a request of class c whose caller waits until deadline
// (the zero time: no deadline), or refuses it with ErrLimit or
// ErrDeadline. It never waits: with a queue (Config.QueueSize), it takes
// a free slot only when no waiting request goes first. An admitted
// request must call the Permit's Release exactly once when it ends.
func (l *Limiter) Acquire(c Class, deadline time.Time) (Permit, error) {
	return l.acquire(context.Background(), false, c, deadline)
}

// acquire is Acquire (queue false) and Wait.
func (l *Limiter) acquire(ctx context.Context, queue bool, c Class, deadline time.Time) (Permit, error) {
	at, now := l.now()
	cur := l.inflight.Load()
	if !deadline.IsZero() && cur > 0 && at-l.lastDone.Load() <= slowWindows*int64(l.cfg.Window) {
		if need := max(l.needed.Load(), (cur+1)*l.perDone.Load()); need > 0 && int64(deadline.Sub(now)) < need {
			l.rejected[reasonDeadline].Add(1)
			return Permit{}, ErrDeadline
		}
	}
	hasQueue := l.cfg.QueueSize > 0
	if !hasQueue || l.waiting.Load() == 0 {
		lim := l.classLimit(c, l.limit.Load())
		for cur < lim {
			if l.inflight.CompareAndSwap(cur, cur+1) {
				return Permit{l: l, start: at}, nil
			}
			cur = l.inflight.Load()
		}
		if !hasQueue {
			l.rejected[reasonLimit].Add(1)
			return Permit{}, ErrLimit
		}
	}
	return l.enqueue(ctx, queue, c, deadline, at, now)
}

// Outcome is how an admitted request ended, for Release.
type Outcome int

// The outcomes.
const (
	// Measured: the request's latency is a sample of the server's
	// latency (whether it succeeded or failed).
	Measured Outcome = iota
	// Ignored: the request's latency says nothing about the server's (a
	// long-lived stream); it frees its slot only.
	Ignored
)

// Permit is an admitted request. The zero Permit is valid and does
// nothing.
type Permit struct {
	l     *Limiter
	start int64
}

// Release ends the request: it frees its slot and, for Measured, records
// its latency, updating the limit at the end of a window. Call it exactly
// once per admitted request.
func (p Permit) Release(o Outcome) {
	l := p.l
	if l == nil {
		return
	}
	inflight := l.inflight.Add(-1) + 1
	if o == Measured {
		at, _ := l.now()
		l.record(at, p.start, inflight)
	}
	if l.waiting.Load() > 0 {
		l.dispatch()
	}
}

// record adds the latency of a request admitted at start (nanoseconds
// since origin) that ended at at, with inflight requests in flight, and
// ends the window or the probe when due.
func (l *Limiter) record(at, start, inflight int64) {
	rtt := max(at-start, 0)
	w := int64(l.cfg.Window)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastDone.Store(at)
	if l.winStart < 0 || at < l.winStart {
		l.winStart = at // the first sample, or a clock that went back
	}
	if l.probing {
		// Only requests admitted once the requests from before the probe
		// are gone measure the latency without their queue.
		if l.drainedAt >= 0 && start >= l.drainedAt {
			l.psum += rtt
			l.pn++
		}
		if l.drainedAt < 0 && inflight-1 <= l.probeLimit {
			l.drainedAt = at
		}
		if l.pn < minSamples && at-l.probeStart < probeTimeout*w && at >= l.probeStart {
			return
		}
		if l.pn > 0 {
			l.base = float64(l.psum) / float64(l.pn)
		}
		l.probing = false
		l.limit.Store(int64(l.est))
		l.winStart, l.sum, l.count, l.maxInflight = at, 0, 0, 0
		return
	}
	if l.count == 0 || rtt < l.least {
		l.least = rtt
	}
	l.sum += rtt
	l.count++
	l.maxInflight = max(l.maxInflight, inflight)
	if age := at - l.winStart; age < w || (l.count < minSamples && age < slowWindows*w) {
		return
	}
	// Busy time is at most the window and at most the sum of the
	// latencies: at low load the window is mostly idle, and the gap
	// between arrivals is not what a request needs.
	l.perDone.Store(min(at-l.winStart, l.sum) / l.count)
	l.update(at)
	l.winStart, l.sum, l.count, l.maxInflight = at, 0, 0, 0
}

// update ends a window at time at: the gradient step, and the start of a
// probe when one is due. Called with mu held.
func (l *Limiter) update(at int64) {
	short := max(float64(l.sum)/float64(l.count), 1)
	if l.base == 0 || short < l.base {
		l.base = short
	}
	gradient := min(max(l.cfg.Tolerance*l.base/short, minGradient), maxGradient)
	next := l.est*gradient + max(1, math.Log10(l.est))
	used := float64(l.maxInflight)*2 >= l.est
	if !used {
		// The server uses less than half the limit: the latency says
		// nothing about a larger one, so do not grow.
		next = min(next, l.est)
	}
	smoothing := smoothUp
	if next < l.est {
		smoothing = smoothDown
	}
	l.est = l.est*(1-smoothing) + next*smoothing
	l.est = min(max(l.est, float64(l.cfg.MinLimit)), float64(l.cfg.MaxLimit))
	l.needed.Store(l.least)
	l.windows++
	queued := gradient < 1 && l.wasQueued
	l.wasQueued = gradient < 1
	if l.windows >= probeEvery && used && queued {
		// Probe: quarter the limit until the queue is down to it and a
		// few requests admitted after that have measured the latency.
		l.windows = 0
		l.probing, l.probeStart, l.drainedAt, l.psum, l.pn = true, at, -1, 0, 0
		l.probeLimit = max(int64(l.est)/4, int64(l.cfg.MinLimit))
		l.limit.Store(l.probeLimit)
		return
	}
	l.limit.Store(int64(l.est))
}

// Limit returns the current limit.
func (l *Limiter) Limit() int { return int(l.limit.Load()) }

// InFlight returns the number of admitted requests not yet released.
func (l *Limiter) InFlight() int { return int(l.inflight.Load()) }

// Latency returns the least latency of the last window: what the server
// currently needs to serve a request, below which a deadline is refused.
// Zero before the first window ended.
func (l *Limiter) Latency() time.Duration { return time.Duration(l.needed.Load()) }

// Stats is a snapshot of a Limiter, for metrics.
type Stats struct {
	Limit    int
	InFlight int
	// Latency is Limiter.Latency.
	Latency time.Duration
	// Queue is the number of requests waiting in the queue (Wait).
	Queue int
	// RejectedLimit, RejectedDeadline and RejectedQueue count the
	// requests refused with ErrLimit, ErrDeadline and ErrQueueTimeout
	// since New.
	RejectedLimit, RejectedDeadline, RejectedQueue int64
}

// Stats returns a snapshot of l.
func (l *Limiter) Stats() Stats {
	return Stats{
		Limit:            l.Limit(),
		InFlight:         l.InFlight(),
		Latency:          l.Latency(),
		RejectedLimit:    l.rejected[reasonLimit].Load(),
		RejectedDeadline: l.rejected[reasonDeadline].Load(),
		Queue:            l.Queue(),
		RejectedQueue:    l.rejected[reasonQueue].Load(),
	}
}
