package breaker

import (
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

// ErrOpen is returned by Allow when the breaker rejects a call: it is open,
// or half-open with all probe slots taken. Check it with errors.Is.
var ErrOpen = errors.New("breaker: open")

// State is the state of a Breaker.
type State int

// The states of a Breaker.
const (
	Closed   State = iota // calls pass; outcomes are counted in the window
	Open                  // calls are rejected until the open interval has passed
	HalfOpen              // a few probe calls pass; they decide between Closed and Open
)

// String returns "closed", "open" or "half-open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Outcome is the result of a call, reported with Permit.Done.
type Outcome int

// The outcomes of a call.
const (
	// Success counts as a successful call.
	Success Outcome = iota
	// Failure counts as a failed call: one the target is to blame for.
	Failure
	// Ignored counts nothing, for a call whose result says nothing about
	// the target (the caller cancelled, the request was invalid). It frees
	// a half-open probe slot. Values other than Success and Failure are
	// treated as Ignored.
	Ignored
)

// String returns "success", "failure" or "ignored".
func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Failure:
		return "failure"
	case Ignored:
		return "ignored"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// The state word packs the state (low 2 bits) and a generation number
// that grows with every state change.
const (
	stateBits = 2
	stateMask = 1<<stateBits - 1
)

func stateOf(w uint64) State { return State(w & stateMask) }

// Breaker is a failure-rate circuit breaker. Create one with New; the zero
// value is not usable. It is safe for concurrent use.
//
// A closed breaker lets every call through and counts outcomes in a sliding
// window of time buckets. When a failure leaves the window with at least
// MinimumCalls calls and a failure rate of at least FailureThreshold (or,
// if set, after ConsecutiveFailures failures in a row), the breaker opens.
// An open breaker rejects calls with ErrOpen until its open interval has
// passed; the next Allow then makes it half-open. Nothing happens in the
// background: the breaker starts no goroutines and no timers and moves only
// inside Allow and Done. A half-open breaker lets up to HalfOpenProbes
// calls through at a time; once that many have succeeded it closes with an
// empty window, and the first probe that fails opens it again with twice
// the open interval (up to MaxOpenInterval, with jitter).
//
// Most callers want Allow, then Done on the returned Permit. In the closed
// state that pair is a few atomic operations and one clock reading, and it
// allocates nothing.
type Breaker struct {
	// Read on every call, written on state changes only.
	word      atomic.Uint64 // generation<<stateBits | state
	openUntil atomic.Int64  // nanoseconds since start; meaningful when Open
	clk       interface{ Now() time.Time }
	mono      bool // clk is the system clock: read only its monotonic part
	start     time.Time
	cfg       Config // normalized
	win       *window

	_      [64]byte
	consec atomic.Int64 // consecutive failures while closed
	_      [56]byte

	mu sync.Mutex
	// Guarded by mu.
	inFlight   int           // half-open probes admitted and not done
	successes  int           // half-open probe successes
	interval   time.Duration // current open interval before jitter
	opened     int           // times opened
	pending    []transition  // changes waiting for OnStateChange
	spare      []transition
	delivering bool // a goroutine is running OnStateChange
}

type transition struct{ from, to State }

// New returns a closed breaker, or an error wrapping ErrInvalidConfig when
// a field of cfg is invalid.
func New(cfg Config) (*Breaker, error) {
	n, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	return newBreaker(n), nil
}

// newBreaker returns a breaker for a normalized config.
func newBreaker(cfg Config) *Breaker {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	b := &Breaker{
		clk:      cfg.Clock,
		cfg:      cfg,
		win:      &window{width: int64(cfg.Window / windowBuckets)},
		interval: cfg.OpenInterval,
	}
	_, b.mono = cfg.Clock.(clock.Real)
	b.start = b.clk.Now()
	if cfg.OnStateChange != nil {
		b.pending = make([]transition, 0, 4)
		b.spare = make([]transition, 0, 4)
	}
	return b
}

// Name returns the Name from the Config.
func (b *Breaker) Name() string { return b.cfg.Name }

// State returns the current state. An open breaker whose interval has
// passed reports Open until the next Allow makes it half-open.
func (b *Breaker) State() State { return stateOf(b.word.Load()) }

// holding reports whether b holds callers out or probes its target: half
// open, or open within its interval. A Set never evicts such a breaker
// (a fresh one would let everyone through); an open breaker whose
// interval ended, which no one has called since (its target is gone),
// may be evicted: the next call would probe anyway.
func (b *Breaker) holding() bool {
	switch b.State() {
	case HalfOpen:
		return true
	case Open:
		return b.elapsed() < b.openUntil.Load()
	}
	return false
}

// elapsed returns the nanoseconds since the breaker was created, never
// negative. On the system clock it reads only the monotonic clock
// (time.Since), which costs about half of time.Now.
func (b *Breaker) elapsed() int64 {
	if b.mono {
		return max(int64(time.Since(b.start)), 0)
	}
	return max(int64(b.clk.Now().Sub(b.start)), 0)
}

// Permit is the right to make one call, returned by Allow. Report the
// call's outcome with Done. The zero Permit's Done does nothing.
type Permit struct {
	b    *Breaker
	word uint64 // the state word at Allow
}

// Allow asks to make a call. If the breaker lets it through, call Done on
// the returned Permit exactly once with the outcome. Otherwise the error
// is ErrOpen and the Permit is zero. Allow never blocks on I/O or time.
func (b *Breaker) Allow() (Permit, error) {
	w := b.word.Load()
	if stateOf(w) == Closed {
		return Permit{b, w}, nil
	}
	return b.allowSlow(w)
}

func (b *Breaker) allowSlow(w uint64) (Permit, error) {
	el := b.elapsed()
	if stateOf(w) == Open && el < b.openUntil.Load() {
		return Permit{}, ErrOpen
	}
	b.mu.Lock()
	w = b.word.Load()
	switch stateOf(w) {
	case Closed:
		b.mu.Unlock()
		return Permit{b, w}, nil
	case Open:
		if el < b.openUntil.Load() {
			b.mu.Unlock()
			return Permit{}, ErrOpen
		}
		w = b.setState(HalfOpen)
	}
	if b.inFlight >= b.cfg.HalfOpenProbes {
		b.unlockAndNotify()
		return Permit{}, ErrOpen
	}
	b.inFlight++
	b.unlockAndNotify()
	return Permit{b, w}, nil
}

// Probe reports whether the Permit is for a half-open probe: one of the
// few calls that decide whether the breaker closes. A caller that holds
// permits for a long time (a stream) can report a probe's outcome early, as
// soon as it knows the target answered, to free the probe slot.
func (p Permit) Probe() bool { return p.b != nil && stateOf(p.word) == HalfOpen }

// Done reports the outcome of the call the Permit was given for. Call it
// exactly once per Permit, also when the call was cancelled (with
// Ignored): a half-open probe's Permit holds one of the few probe slots
// until Done, and a breaker whose slots are all held by lost Permits stays
// half-open, rejecting every call. An outcome reported after the breaker
// changed state since Allow is ignored (the Permit remembers the
// generation of the state it was issued in).
func (p Permit) Done(o Outcome) {
	switch {
	case p.b == nil:
	case stateOf(p.word) == Closed:
		p.b.doneClosed(p.word, o)
	default:
		p.b.doneProbe(p.word, o)
	}
}

// doneClosed records a closed-state outcome. A result whose call straddled
// a whole cycle of the breaker (open, half-open, closed again) between the
// generation check below and the record can still land in the fresh
// window; that needs a goroutine stalled for a whole open interval, and the
// record cannot open the breaker by itself (open checks the generation
// again).
func (b *Breaker) doneClosed(w uint64, o Outcome) {
	if o != Success && o != Failure || b.word.Load() != w {
		return
	}
	el := b.elapsed()
	if o == Success {
		b.win.record(el, false, &b.mu)
		if b.consec.Load() != 0 {
			b.consec.Store(0)
		}
		return
	}
	b.win.record(el, true, &b.mu)
	n := b.consec.Add(1)
	if !b.tripped(el, n) {
		return
	}
	u := b.cfg.Rand()
	b.mu.Lock()
	if b.word.Load() == w {
		b.open(el, u)
	}
	b.unlockAndNotify()
}

// tripped reports whether a closed breaker should open, after a failure
// at el that made n consecutive failures.
func (b *Breaker) tripped(el, n int64) bool {
	if b.cfg.ConsecutiveFailures > 0 && n >= int64(b.cfg.ConsecutiveFailures) {
		return true
	}
	calls, failures := b.win.sum(el)
	return calls >= int64(b.cfg.MinimumCalls) &&
		float64(failures)/float64(calls) >= b.cfg.FailureThreshold
}

func (b *Breaker) doneProbe(w uint64, o Outcome) {
	var el int64
	var u float64
	if o == Failure {
		el, u = b.elapsed(), b.cfg.Rand()
	}
	b.mu.Lock()
	if b.word.Load() != w {
		// The half-open period this probe belonged to is over; its slots
		// were discarded with it.
		b.mu.Unlock()
		return
	}
	if b.inFlight > 0 {
		b.inFlight--
	}
	switch o {
	case Success:
		b.successes++
		if b.successes >= b.cfg.HalfOpenProbes {
			b.setState(Closed)
		}
	case Failure:
		if b.interval > b.cfg.MaxOpenInterval/2 {
			b.interval = b.cfg.MaxOpenInterval
		} else {
			b.interval *= 2
		}
		b.open(el, u)
	}
	b.unlockAndNotify()
}

// open opens the breaker at el for the current interval with jitter u.
// b.mu is held.
func (b *Breaker) open(el int64, u float64) {
	d := int64(jittered(b.interval, b.cfg.Jitter, u))
	until := el + d
	if until < el { // overflow
		until = math.MaxInt64
	}
	b.openUntil.Store(until)
	b.opened++
	b.setState(Open)
}

// jittered returns d spread uniformly over [d*(1-j), d*(1+j)) by u in
// [0, 1); u outside is clamped. j < 0 (NoJitter) means d.
func jittered(d time.Duration, j, u float64) time.Duration {
	if j <= 0 {
		return d
	}
	switch {
	case !(u >= 0): // also NaN
		u = 0
	case u > 1:
		u = 1
	}
	off := time.Duration(float64(d) * j * (2*u - 1))
	if off > 0 && d > math.MaxInt64-off {
		return math.MaxInt64 // saturate: an interval near 292 years plus jitter
	}
	return d + off
}

// setState moves to state to with a new generation, records the change
// for OnStateChange and returns the new state word. b.mu is held.
func (b *Breaker) setState(to State) uint64 {
	old := b.word.Load()
	w := (old>>stateBits+1)<<stateBits | uint64(to)
	b.word.Store(w)
	switch to {
	case HalfOpen:
		b.inFlight, b.successes = 0, 0
	case Closed:
		b.win.reset()
		b.consec.Store(0)
		b.interval = b.cfg.OpenInterval
	}
	if b.cfg.OnStateChange != nil {
		b.pending = append(b.pending, transition{stateOf(old), to})
	}
	return w
}

// unlockAndNotify unlocks b.mu and, unless another goroutine is already at
// it, reports the pending state changes to OnStateChange with no lock
// held, in order, until none are left.
func (b *Breaker) unlockAndNotify() {
	if b.delivering || len(b.pending) == 0 {
		b.mu.Unlock()
		return
	}
	b.delivering = true
	for {
		batch := b.pending
		b.pending, b.spare = b.spare[:0], nil
		b.mu.Unlock()
		b.notify(batch)
		b.mu.Lock()
		b.spare = batch[:0]
		if len(b.pending) == 0 {
			b.delivering = false
			b.mu.Unlock()
			return
		}
	}
}

// notify calls OnStateChange for each change in batch. If it panics, the
// delivery role is given up so that later changes are still reported.
func (b *Breaker) notify(batch []transition) {
	ok := false
	defer func() {
		if !ok {
			b.mu.Lock()
			b.delivering = false
			b.mu.Unlock()
		}
	}()
	for _, t := range batch {
		b.cfg.OnStateChange(b.cfg.Name, t.from, t.to)
	}
	ok = true
}

// Snapshot is the state of a Breaker at one moment, for metrics.
type Snapshot struct {
	Name  string
	State State
	// Calls and Failures are the outcomes counted in the window (closed
	// state only; the window is emptied when the breaker closes).
	Calls, Failures int64
	// ConsecutiveFailures is the current run of failures while closed.
	ConsecutiveFailures int64
	// OpenInterval is the current open interval before jitter: the
	// interval the breaker is open for now, or will be when it next opens.
	OpenInterval time.Duration
	// TimesOpened counts the changes to Open since New.
	TimesOpened int
}

// Snapshot returns the breaker's current state and counts.
func (b *Breaker) Snapshot() Snapshot {
	el := b.elapsed()
	calls, failures := b.win.sum(el)
	b.mu.Lock()
	defer b.mu.Unlock()
	return Snapshot{
		Name:                b.cfg.Name,
		State:               stateOf(b.word.Load()),
		Calls:               calls,
		Failures:            failures,
		ConsecutiveFailures: b.consec.Load(),
		OpenInterval:        b.interval,
		TimesOpened:         b.opened,
	}
}
