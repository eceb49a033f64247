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
	DefaultTarget       = 20 * time.Millisecond
	DefaultWindow       = 10 * time.Millisecond
	DefaultRetryShare   = 0.5
	DefaultQueueTimeout = 100 * time.Millisecond
	DefaultQueueTarget  = 5 * time.Millisecond

	// MinWindow and MaxWindow bound Config.Window.
	MinWindow = time.Millisecond
	MaxWindow = time.Second
	// MaxTarget bounds Config.Target.
	MaxTarget = time.Minute
)

// The constants of the overload rule (see Limiter).
const (
	// A window whose arrivals exceed its completions by growthShare
	// (plus growthMargin requests) makes the server suspect (suspect.go).
	growthShare  = 0.1
	growthMargin = 2
	// calmWindows windows in a row whose arrivals, refused ones included,
	// do not exceed the completions end it.
	calmWindows = 2
	// The tests of calm span calmEvents arrivals and completions at
	// least, calmSpan windows at most (see calmSpanNow).
	calmEvents = 64
	calmSpan   = 16
	// belowShare of the rate served during an overload: what is offered
	// below it ends the overload (see belowServed).
	belowShare = 0.7
	// rateWindows windows measure the completion rate.
	rateWindows = 4
	// historyWindows windows are remembered: the most requests in flight
	// over them, which a growth must exceed (a closed loop only ever
	// returns to its own number of callers), and the mean latency of
	// their successes, the base.
	historyWindows = 128
	// minEvents arrivals and completions end a window early enough to
	// count; a window with fewer lasts up to maxWindows windows.
	minEvents  = 8
	maxWindows = 8
	// minSamples successes in the history make the mean of their
	// latencies the base.
	minSamples = 4
	// freeSamples successes admitted with nothing else in flight make
	// the mean of their latencies a base (see followService).
	freeSamples = 8
	// modelSamples served requests admitted by the overload rule make
	// a batch that checkModel checks against the rule's model of the
	// server (a long batch also spans twice what they took); modelChecks
	// batches in a row that do not fit it (their latencies at most
	// modelCorr correlated with what it expected) show that it does not
	// describe the server.
	modelSamples = 16
	modelChecks  = 2
	modelCorr    = 0.3
	// baseDrift bounds how far the base follows the server's latency
	// while it is overloaded; it follows only a least latency above the
	// base plus followMargin targets, for followFor windows before it is
	// judged again (see followService). followMargin is 1: the largest
	// threshold, a first attempt's, is the base plus one target, and a
	// server whose least latency is above it is admitted almost nothing
	// by its expected latency, however few wait (each request expects at
	// least that latency). At 1.5, a server 7.5 times slower (4 -> 30 ms)
	// while overloaded was never followed and served 39 % of what its
	// workers could.
	baseDrift    = 8
	followMargin = 1.0
	followFor    = 50
	// probeEvery windows of overload, a probe tells a closed loop from an
	// open one (see Limiter); probeWindows is its length (longer at low
	// rates: probeArrivals), its second half measured; closedRatio is the
	// drop of arrivals that says "closed". Not a half of one window: a
	// tier starved of CPU reads its callers' connections late, in bursts
	// (windows of nothing, then hundreds), and a gateway at twice its
	// chain's capacity, open loop, read 9 arrivals in a second half of 12
	// ms where 8 a millisecond came before: read as a closed loop's
	// pause, it ended the overload, and the gateway never refused again
	// (busy's CPU-bound overload, TestProbeOutlastsAStarvedWindow). The
	// price: during a probe, every 50 windows of an overload, a refused
	// request waits up to 8 windows (80 ms) for its refusal, and a caller
	// whose deadline is nearer gets its deadline's error instead.
	probeEvery    = 50
	probeWindows  = 8
	probeArrivals = 32
	closedRatio   = 0.5
	// An overload that began with waiters (the suspect phase's) keeps
	// them waiting for spinWindows windows at most (a timer), until a
	// verdict tells whether its callers send again the moment they are
	// refused, a closed loop still ramping up (the server is suspect
	// again, its waiters served oldest first), or not (the waiters are
	// refused). The evidence: the first attempts offered since the
	// overload began (at least probeArrivals of them), against the
	// offered rate of before. The bar falls as the evidence accumulates:
	// spinRatio windows' worth of the arrivals of before (checked as the
	// refusals come, spinEarly), spinRatio times the rate of before over
	// one window, down to spinRatioLater times over spinRatio /
	// spinRatioLater windows and more. If the first window does not
	// decide, spinSeed windows' worth of the waiters, the newest, are
	// refused at once: a closed loop's refused callers come back, an
	// open loop's do not (or as retries, which do not count).
	//
	// Measured (tiers that logged the ratio): ghz ramping 512 and 1 024
	// callers over 1.6 and 3.1 s into a pool, over TCP, 7.4-24 in the
	// first window; busy's CPU-bound overload, an open loop at twice its
	// chain's capacity read by a starved gateway in bursts, 0.2-2.0 (8
	// runs); in a review's simulations, a tier that reads its callers
	// 40 ms late about 4 in one window, callers that retry a refusal at
	// once, up to 5 times, up to 5 (at 3, and counting retries, both
	// were taken for closed loops and left backlogs of seconds). Hence
	// first attempts only, a bar for one window above what a late
	// reader shows, and the rate of before as the higher of the last
	// rateWindows' and the whole suspect phase's (a starved reader can
	// leave the last windows nearly empty). Refused callers that come
	// back in milliseconds (a chain whose CPU is saturated) spin at a
	// few times the rate of before: with a bar of 10 and no other, such
	// a ramp was taken for an open loop, and every caller refused until
	// the next probe (over TCP, 8 400-22 200 refusals in 8 of 16 ramps).
	// The bar is 6, not 10: every overload of a ramp refuses the spin
	// until the bar is met (over TCP, 45-63 % fewer refusals at 6; on
	// the review grid, 38 % fewer, the other families unchanged). The price for
	// an open loop: its waiters are refused up to 80 ms later, or meet
	// their deadlines first.
	spinWindows    = 8
	spinRatio      = 6
	spinRatioLater = 3
	spinSeed       = 8
)

// The answer probe (see startAnswerProbe): within closedMemory windows
// of a closed loop found, or where no waiting caller set a deadline of
// patientBudget or less, a suspect phase that runs out holds the
// answers of what it serves for answerHold, a time rather than windows
// (a caller's round trip and the answers it waits for do not scale with
// Config.Window), and reads the arrivals of its second half. 80 ms, as
// an overload's probe at the default window: over TCP, a ramp's
// arrivals fell to 0.18-0.44 of the rate before during the hold.
//
// patientBudget: before a closed loop is found, the probe runs only
// where every waiting caller is patient, its deadline leaving more
// than this when it began to wait (or no deadline at all): a second,
// the longest deadline of interactive callers, and the one this
// package's overload tests and busy's give their open loops, which a
// verdict tells without a hold. Load tools send longer ones (ghz 20 s
// by default), as do batch jobs; for them the hold is a small part of
// their wait.
const (
	closedMemory  = 100
	answerHold    = 80 * time.Millisecond
	patientBudget = time.Second
)

// ErrInvalidConfig is wrapped by the error New returns for an invalid
// Config. Check it with errors.Is.
var ErrInvalidConfig = errors.New("admission: invalid config")

// The reasons a request is refused, returned by Acquire and Wait. Check
// them with errors.Is.
var (
	// ErrOverload: requests arrive faster than the server completes
	// them, and the request would wait longer than the latency target of
	// its class.
	ErrOverload = errors.New("admission: overloaded: the request would wait longer than the latency target")
	// ErrDeadline: the server is overloaded and the request's remaining
	// deadline is shorter than the latency it can expect.
	ErrDeadline = errors.New("admission: overloaded: deadline shorter than the expected latency")
	// ErrLimit: the requests in flight have reached Config.MaxInFlight
	// for the request's class (and the queue, if any, had no room).
	ErrLimit = errors.New("admission: concurrency limit reached")
)

// Clock tells the time: any value with a Now method (a test's clock that
// moves only when told; nil in a Config means the system clock).
// Durations are taken as Now().Sub(start), so a clock whose readings
// carry Go's monotonic component (time.Now does) is immune to wall-clock
// jumps.
type Clock interface {
	Now() time.Time
}

// Class is the value of a request to its caller, which decides the order
// in which requests are shed: under overload, hedges go first, then
// retries, then the first attempts of callers that are already retrying,
// first attempts last.
type Class int

// The classes, from the most valuable.
const (
	// ClassFirst is a first attempt from a caller that is not retrying.
	// It may wait the whole latency target.
	ClassFirst Class = iota
	// ClassUpstreamRetrying is a first attempt from a caller that is
	// serving a retry of its own caller (x-upstream-retries > 0). It may
	// wait half-way between the retry share of the target and the whole.
	ClassUpstreamRetrying
	// ClassRetry is a retry (x-retry-attempt >= 1 or
	// grpc-previous-rpc-attempts >= 1). It may wait Config.RetryShare of
	// the latency target.
	ClassRetry
	// ClassHedge is a hedge (a second request for an answer still
	// awaited, sent by a caller to cut its tail latency), or a request
	// that serves one: extra load by design. It may wait half of what a
	// retry may.
	ClassHedge
	numClasses
)

var classNames = [numClasses]string{"first", "upstream_retrying", "retry", "hedge"}

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
	// Target is the longest queueing delay that a first attempt may be
	// admitted into while the server is overloaded: the latency the
	// server can expect to need (see Limiter) may exceed its latency
	// without a queue by at most Target. It says nothing while the server
	// keeps up with its arrivals, however long the latency. Zero means
	// DefaultTarget (20 ms, DAGOR's queueing-time threshold). Valid: up
	// to MaxTarget (1 min).
	Target time.Duration
	// Window is the interval over which arrivals and completions are
	// compared (a window with fewer than 8 of them lasts longer, up to 8
	// Windows). Zero means DefaultWindow (10 ms). Valid: MinWindow (1 ms)
	// to MaxWindow (1 s).
	Window time.Duration
	// RetryShare is the share of Target that retries may wait (see
	// Class); a caller already retrying gets half-way between it and the
	// whole, a hedge half of it. Zero means DefaultRetryShare (0.5). Valid: 0 < RetryShare <=
	// 1; 1 sheds retries no earlier than first attempts.
	RetryShare float64
	// MaxInFlight, when not zero, is a fixed cap on the requests in
	// flight: a first attempt is refused (ErrLimit) when MaxInFlight are,
	// a retry at RetryShare of it. Use it for a server that must never
	// run more than so many requests at once (a pool of connections to a
	// database); the overload rule needs no cap. The suspect phase and
	// the trial (see Permit.Trial) never pass it either (a retry that
	// waited in the suspect phase may go in up to all of it, not only its
	// share). Zero means none.
	// Valid: 0 to 1 073 741 824.
	MaxInFlight int
	// QueueSize is the number of requests that may wait in Wait for a
	// slot when MaxInFlight is reached (see Limiter.Wait). Zero means no
	// queue: such a request is refused at once. Valid: >= 0, and zero
	// without MaxInFlight.
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
	// timeouts and the probes' holds use the clock's AfterFunc when it
	// has one (see Timers), time.AfterFunc otherwise. A step back (a wall
	// clock corrected) is not taken back: the time after it adds from
	// where the limiter was.
	Clock Clock
}

func (c *Config) resolve() error {
	switch {
	case c.Target < 0 || c.Target > MaxTarget:
		return invalidf("Target %v out of range [0, %v]", c.Target, MaxTarget)
	case c.Window != 0 && (c.Window < MinWindow || c.Window > MaxWindow):
		return invalidf("Window %v out of range [%v, %v]", c.Window, MinWindow, MaxWindow)
	case math.IsNaN(c.RetryShare) || c.RetryShare < 0 || c.RetryShare > 1:
		return invalidf("RetryShare %v out of range (0, 1]", c.RetryShare)
	case c.MaxInFlight < 0 || c.MaxInFlight > 1<<30:
		return invalidf("MaxInFlight %d: want 0 to %d", c.MaxInFlight, 1<<30)
	case c.QueueSize > 0 && c.MaxInFlight == 0:
		return invalidf("QueueSize %d without MaxInFlight: requests queue only at a fixed cap", c.QueueSize)
	}
	if err := c.resolveQueue(); err != nil {
		return err
	}
	orDefault(&c.Target, DefaultTarget)
	orDefault(&c.Window, DefaultWindow)
	orDefault(&c.RetryShare, DefaultRetryShare)
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return nil
}

// Limiter is admission control for one server: Acquire (or Wait) before
// a request runs, and the Permit's Release when it ends.
//
// It refuses a request only while the server is overloaded, that is
// while requests arrive faster than it completes them, and only a
// request that would then wait longer than the latency target of its
// class, or than its own deadline. A server at capacity that keeps up,
// such as one loaded by a fixed number of callers that each send the
// next request when the last one is answered (a load test, a batch job,
// a worker pool), is never refused anything, however long its latency:
// arrivals cannot exceed completions there, and refusing would only send
// its callers back at once. Nor is a server whose latency is its
// dependency's, or that of its own retries: latency is not load.
//
// When a window's arrivals exceed its completions by a tenth, and the
// requests in flight exceed the most in flight over the last 128 windows
// (a closed loop never exceeds its own number of callers) and would wait
// past the target, the server is suspect: it refuses nothing, but a
// request beyond the concurrency its throughput needs waits in Wait,
// newest first, until a completion admits it (see suspect.go: a closed
// loop of callers that is still ramping up looks exactly like the start
// of an overload, and is calm again within a few windows). When the
// arrivals still exceed the completions after 30 windows (see suspect.go
// for when sooner or later), the server is overloaded, and the waiters
// are refused (after up to 8 windows: a closed loop that ramps for
// longer than the suspect phase tells itself apart when refused, and the
// server is suspect again, its waiters served oldest first; see
// verdict). Within 100 windows (a second by default) of a closed loop
// found, or where none of its waiting callers set a deadline of a
// second or less (no deadline, or a load tool's 20 s), a suspect phase
// that runs out first holds its answers for up to 80 ms (HoldAnswer;
// where about 800 requests a second or more arrive): a closed loop's
// arrivals fall below half their rate, and the server is suspect again
// without refusing anyone (see startAnswerProbe). While
// overloaded, the server expects a new request to need
//
//	expected = (in flight + 1) x (time per completion over the last 4 windows)
//
// (Little's law, for a server that serves in order or shares its CPU;
// with fewer in flight than it has workers, by the time per completion
// of its suspect phase, no more than the base: see idleWorkers),
// and admits it when expected <= base + Target x share of its class,
// where base is the mean latency of the successful requests of the last
// 128 windows before the overload (see whileNot; at a cold start at
// least their total time on test, see coldStart; followed up to 8 times
// while overloaded, for a server that became slower rather than queued:
// see followService; raised to what the requests the rule admitted took,
// when that exceeds what it expected for them by more than the target
// and does not follow what it expected, for two batches in a row (of
// 16, or spanning twice what they took): a server that waits rather
// than queues, see checkModel), and, when the request has a deadline,
// expected <= its remaining time. Retries go first (Class). Overload
// ends after 2 windows in a row in which arrivals, refused ones
// included, did not exceed completions (those served, while the server
// serves anything), or in which what was offered, refused requests
// included, came at less than 0.7 of the rate the server served at
// during the overload, with fewer in flight than that rate needs (it
// had room for what it refused; see whileOverloaded).
//
// One state looks like overload and is not: a closed loop of callers
// that was refused once sends again at once, so that its refused
// arrivals exceed completions forever. Every 50 windows of overload,
// Wait holds the requests it refuses for a while (eight windows, or long
// enough to expect 32 arrivals) before it answers: a closed loop's
// callers then wait, and its arrivals fall by half or more in the second
// half, while an open loop's do not. A fall ends the overload.
//
// With Config.MaxInFlight, a fixed cap applies too, and Config.QueueSize
// lets a request that meets it wait for a slot (see Wait).
//
// Acquire and Release allocate nothing and take no lock, but once per
// window, when one of them takes a short one, and while an overload's
// verdict is pending, when a refusal brings the evidence it waits for
// (spinEarly: it tries the lock, and never waits for it). A Limiter
// must be created with New.
type Limiter struct {
	clk      Clock
	since    *clock.Since // the time since origin, never going back
	origin   time.Time
	cfg      Config
	capAll   int64 // MaxInFlight
	capRetry int64
	capMid   int64
	capHedge int64
	retryPM  int64 // RetryShare x 1000
	middlePM int64 // half-way between retryPM and 1000

	_ [64]byte
	// Written by every request: one cache line. The admitted arrivals
	// since New are inflight + completions (Measured and Failed), so
	// that Acquire changes one counter: a request released Ignored is
	// then neither an arrival nor a completion.
	inflight atomic.Int64
	// heldIn: the requests held above (WaitHeld) that the server
	// admitted while suspect, not held, still in flight (see
	// takeUnheld).
	heldIn    atomic.Int64
	latSum    atomic.Int64 // nanoseconds of Measured latencies, since New
	latN      atomic.Int64 // Measured completions, since New
	okAt      atomic.Int64 // nanoseconds since origin at the last Measured release
	_         [32]byte
	failed    atomic.Int64 // Failed completions, since New
	abandoned atomic.Int64 // Abandoned requests, since New
	wasted    atomic.Int64 // of those, the ones that held their slot at least the base latency
	servedAt  atomic.Int64 // nanoseconds since origin at the last Measured or Failed release
	refused   atomic.Int64 // refused by the overload and deadline rules, since New
	spinCheck atomic.Int64 // while an overload's verdict is pending: refused at which it runs early (spinEarly); else 0
	entered   atomic.Int64 // requests that waited while the server was suspect, since New
	fromQueue atomic.Int64 // of those, admitted from the wait, since New
	gone      atomic.Int64 // of those, whose caller left while they waited, since New
	others    atomic.Int64 // of refused, the retries and hedges (see verdict)
	// Read by every request, written once per window.
	winEnd     atomic.Int64 // nanoseconds since origin
	overloaded atomic.Bool
	suspect    atomic.Bool // arrivals exceed completions: wait beyond suspectCap (suspect.go)
	suspectCap atomic.Int64
	// suspectFrom: when the server last became suspect (nanoseconds since
	// origin); of the requests admitted since and served, suspSum and
	// suspN sum what they took, and roomSeen says that one took no
	// longer than the base (see roomFor).
	suspectFrom atomic.Int64
	suspSum     atomic.Int64
	suspN       atomic.Int64
	roomSeen    atomic.Bool
	perDone     atomic.Int64                  // nanoseconds per completion, over the last rateWindows; 0: unknown
	idleUnder   atomic.Int64                  // while overloaded: below this many in flight a worker is free (see idleWorkers)
	stalled     atomic.Int64                  // nanoseconds of the last rateWindows, when none of them completed anything; else 0
	lateLately  atomic.Bool                   // a request of the last rateWindows was Abandoned (see Latency)
	threshold   [numClasses]atomic.Int64      // nanoseconds: base + Target x share
	baseNow     atomic.Int64                  // nanoseconds: the base the thresholds use
	lastMean    atomic.Int64                  // nanoseconds: the mean latency of the last window with minSamples successes, or a later window's least if longer
	least       atomic.Int64                  // the least Measured latency of the window; 0: none
	judging     atomic.Pointer[judgement]     // followService's judgement; never nil
	free        atomic.Pointer[freeLatencies] // since the last overload began (freeMean); never nil
	waitingN    atomic.Int64                  // requests in the queue or about to enter it
	rejected    [numReasons]atomic.Int64
	mdl         model // checkModel's samples
	cold        coldStart

	// grew: the last growth of the suspect cap on the work's evidence in
	// this suspect phase (slowerWork); nil: none yet. fastSeen: a
	// request admitted in the phase was served within twice the base.
	grew     atomic.Pointer[growth]
	fastSeen atomic.Bool

	trialAt atomic.Int64 // when the last trial went in (see trialDue); nanoseconds since origin

	q  queue
	sq suspectQueue

	mu sync.Mutex
	// Guarded by mu.
	winStart   int64
	last       snapshot // the counters at winStart
	hist       [historyWindows]window
	histN      int // windows recorded, up to historyWindows
	histAt     int // index of the next one
	growthRun  int
	calmRun    int
	belowRun   int                 // windows in a row in which belowServed held
	overServed int64               // successes during this overload
	overDur    int64               // nanoseconds of this overload's windows
	base       int64               // nanoseconds
	overSince  int64               // windows since the overload started
	following  bool                // the base follows the server's latency (followService)
	followed   int64               // windows it has followed
	followTo   int64               // nanoseconds: the least latency the judgement saw, which the base follows up to
	judged     int64               // windows since the judgement started
	probe      pause               // an overload's: its refusals held (holdRefusal)
	spinBefore float64             // offered arrivals per nanosecond before the overload
	spinAt     int64               // when the overload began
	spinFrom   int64               // offered arrivals then
	spinOthers int64               // others then
	pending    bool                // the overload's first waiters wait for its verdict
	seeded     bool                // the verdict refused some of them (see verdict)
	suspectFor int64               // windows since the server became suspect in which its completions did not grow
	suspectAll int64               // windows since the server became suspect
	suspectMax int64               // suspectFor windows it may stay suspect before it is overloaded
	suspectIn  int64               // in flight when it became suspect
	grewAt     [2]int64            // the suspectAll of the phase's last two windows in which the cap grew, the latest first (-1: none)
	held       [calmSpan + 1]int64 // what the server held at the end of the last windows, oldest first (recordHeld)
	floor      int64               // a base that checkModel found, the least base for floorFor more windows outside an overload (roll counts)
	floorFor   int64
	// perFull: the time per completion of the suspect phase before this
	// overload (nanoseconds; 0: unknown); suspDone and suspOffered: the
	// completions and the offered arrivals when the server last became
	// suspect (see idleWorkers and verdict).
	perFull     int64
	suspDone    int64
	suspOffered int64
	// The answer probe of a suspect phase that ran out (see
	// startAnswerProbe; its answers held: HoldAnswer), and whether this
	// phase's found no closed loop.
	answerProbe pause
	answerTried bool
	calmAfter   int64 // windows of the suspect phase before its tests of calm count (calmWindows; more after an answer probe)
	closedAt    int64 // when a verdict or an answer probe last found a closed loop; 0: none since a verdict found an open loop
}

// snapshot is the cumulative counters at one time. arrived counts the
// arrivals that were not refused: admitted at once, or queued while the
// server was suspect (those admitted from the queue later are not
// arrivals again).
type snapshot struct {
	arrived, refused, done, latSum, latN, gone, abandoned, wasted int64
}

func (l *Limiter) counters() snapshot {
	n, f, a := l.latN.Load(), l.failed.Load(), l.abandoned.Load()
	admitted := l.inflight.Load() + n + f + a
	return snapshot{admitted - l.fromQueue.Load() + l.entered.Load(), l.refused.Load(), n + f + a, l.latSum.Load(), n, l.gone.Load(), a, l.wasted.Load()}
}

// window is what one window saw.
type window struct {
	dur                    int64
	arrived, refused, done int64
	gone                   int64 // waited while suspect, and its caller left
	abandoned              int64 // of done, Abandoned
	wasted                 int64 // of abandoned, those that held their slot at least the base latency
	latSum, latN           int64 // Measured latencies: their sum (nanoseconds) and number
	least                  int64 // the least Measured latency; 0: none
	inflight               int64 // at its end
	over                   bool  // the server was overloaded during it
	// queued: the server was suspect at its end: what it admitted may
	// have waited behind what it held, and its latencies are no sample
	// of the base (pooledMean).
	queued bool
	// busy: the arrivals of the last rateWindows windows, this one's
	// included, exceeded their completions: a queue was building, and
	// its latencies are no sample of the base where calm windows give
	// one (pooledMean).
	busy bool
}

// mean is the mean of w's Measured latencies, 0 with fewer than
// minSamples of them.
func (w *window) mean() int64 {
	if w.latN < minSamples {
		return 0
	}
	return w.latSum / w.latN
}

// reason indexes the rejection counters.
type reason int

const (
	reasonLimit reason = iota
	reasonDeadline
	reasonQueue
	reasonOverload
	numReasons
)

// New returns a Limiter for cfg, or an error wrapping ErrInvalidConfig that
// names the offending field.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	l := &Limiter{
		clk:     cfg.Clock,
		cfg:     cfg,
		capAll:  int64(cfg.MaxInFlight),
		retryPM: int64(math.Round(cfg.RetryShare * 1000)),
	}
	l.middlePM = (l.retryPM + 1000) / 2
	l.capRetry = l.classCap(ClassRetry)
	l.capMid = l.classCap(ClassUpstreamRetrying)
	l.capHedge = l.classCap(ClassHedge)
	l.since = clock.NewSince(l.clk)
	l.origin = l.since.Start()
	l.winEnd.Store(int64(cfg.Window))
	l.judging.Store(&judgement{}) // from the start, until the first overload starts one
	l.free.Store(&freeLatencies{})
	l.cold.on.Store(true)
	l.setThresholds()
	return l, nil
}

// Config returns the configuration with defaults filled in.
func (l *Limiter) Config() Config { return l.cfg }

// now returns the time since origin in nanoseconds, never less than
// before (see clock.Since): on the system clock its monotonic reading
// only, which costs half of time.Now.
func (l *Limiter) now() int64 { return int64(l.since.Elapsed()) }

// wall returns the time at at (nanoseconds since origin), to compare
// with a caller's deadline.
func (l *Limiter) wall(at int64) time.Time { return l.origin.Add(time.Duration(at)) }

// share returns the share of Target, in thousandths, that class c may
// wait.
func (l *Limiter) share(c Class) int64 {
	switch c {
	case ClassHedge:
		return l.retryPM / 2
	case ClassRetry:
		return l.retryPM
	case ClassUpstreamRetrying:
		return l.middlePM
	}
	return 1000
}

// classCap returns the requests in flight below which a request of class
// c is admitted under MaxInFlight; 0 without a cap.
func (l *Limiter) classCap(c Class) int64 {
	if l.capAll == 0 {
		return 0
	}
	return max(l.capAll*l.share(c)/1000, 1)
}

// capOf returns classCap(c), precomputed.
func (l *Limiter) capOf(c Class) int64 {
	switch c {
	case ClassHedge:
		return l.capHedge
	case ClassRetry:
		return l.capRetry
	case ClassUpstreamRetrying:
		return l.capMid
	}
	return l.capAll
}

// setThresholds publishes l.base + Target x share for every class. l.mu
// is held, or l is new.
func (l *Limiter) setThresholds() { l.publishThresholds(l.base) }

// publishThresholds publishes base + Target x share for every class.
// l.mu is held, or l is new.
func (l *Limiter) publishThresholds(base int64) {
	l.baseNow.Store(base)
	for c := range Class(numClasses) {
		l.threshold[c].Store(base + int64(l.cfg.Target)*l.share(c)/1000)
	}
}

// Acquire admits a request of class c whose caller waits until deadline
// (the zero time: no deadline), or refuses it with ErrOverload,
// ErrDeadline or ErrLimit. It never waits: with a queue
// (Config.QueueSize), it takes a free slot only when no waiting request
// goes first. An admitted request must call the Permit's Release exactly
// once when it ends.
func (l *Limiter) Acquire(c Class, deadline time.Time) (Permit, error) {
	return l.acquire(context.Background(), false, false, c, deadline)
}

// acquire is Acquire (queue false), Wait (queue true) and WaitHeld
// (queue and heldAbove true); a nil ctx is context.Background().
func (l *Limiter) acquire(ctx context.Context, queue, heldAbove bool, c Class, deadline time.Time) (Permit, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if c < 0 || c >= numClasses {
		c = ClassFirst
	}
	at := l.now()
	if at >= l.winEnd.Load() {
		l.roll(at)
	}
	var exp int64 // what the overload rule expects for the request
	above := false
	for {
		p, w, e, err := l.gate(queue, heldAbove, c, deadline, at)
		exp = e
		if err != nil {
			if queue {
				l.holdRefusal(ctx)
			}
			return Permit{}, err
		}
		if p.l != nil {
			return p, nil
		}
		if w == nil {
			above = queue && heldAbove && l.suspect.Load()
			break
		}
		if p, err, settled := l.await(ctx, w, c, deadline); settled {
			return p, err
		}
		// The wait ended undecided (the server is overloaded, or no
		// longer suspect): decide as a new arrival.
		at = l.now()
	}
	if l.capAll == 0 {
		p := l.permit(at, exp)
		p.free = l.inflight.Add(1) == 1
		return l.countAbove(p, above), nil
	}
	if l.cfg.QueueSize == 0 || l.waiting() == 0 {
		if p, ok := l.take(c, at); ok {
			p.expected = exp
			return l.countAbove(p, above), nil
		}
		if l.cfg.QueueSize == 0 {
			l.rejected[reasonLimit].Add(1)
			return Permit{}, ErrLimit
		}
	}
	return l.enqueue(ctx, queue, c, deadline, at, l.wall(at))
}

// countAbove marks p, if above, as a request held above that the server
// admitted while suspect, counted in heldIn until its Release.
func (l *Limiter) countAbove(p Permit, above bool) Permit {
	if above {
		p.above = true
		l.heldIn.Add(1)
	}
	return p
}

// gate applies the overload rule and the suspect phase to a request of
// class c arriving at at: it refuses it (err), admits it (p), parks it
// (w, with wait: see suspectWait; a request held above only beyond
// suspectPerSlot times the cap, see WaitHeld) or passes it on to the cap
// (none, with the latency the overload rule expects for it, or 0).
func (l *Limiter) gate(wait, heldAbove bool, c Class, deadline time.Time, at int64) (p Permit, w *suspectWaiter, expected int64, err error) {
	switch {
	case l.overloaded.Load():
		expected, err := l.overload(c, deadline, l.wall(at))
		if err != nil {
			if p, ok := l.trial(at); ok {
				return p, nil, 0, nil
			}
			if c == ClassRetry || c == ClassHedge {
				l.others.Add(1)
			}
			if n := l.refused.Add(1); n == l.spinCheck.Load() {
				l.spinEarly()
			}
			return Permit{}, nil, 0, err
		}
		return Permit{}, nil, expected, nil
	case wait && l.suspect.Load() && (!heldAbove || l.inflight.Load() >= suspectPerSlot*l.suspectLimit(c)):
		p, w, err := l.suspectEnter(c, deadline, at)
		return p, w, 0, err
	}
	return Permit{}, nil, 0, nil
}

// overload applies the overload rule to a request of class c: the
// latency it expects for it (0: nothing to expect) and nil to admit it,
// or the reason to refuse it.
func (l *Limiter) overload(c Class, deadline, now time.Time) (int64, error) {
	per := l.perDone.Load()
	if per == 0 {
		// Nothing completed lately: the rule cannot tell what is
		// queued, and admits; the request expects what one without a
		// queue takes (for checkModel, which a rule that starves the
		// server leaves with few other samples; a pause of the process
		// makes these look slower than expected too, which is why
		// checkModel wants a streak longer than what they took).
		return l.baseNow.Load(), nil
	}
	in := l.inflight.Load()
	expected := (in + 1) * per
	if in < max(l.idleUnder.Load(), 1) {
		// A worker is free (see idleWorkers), or nothing is in flight:
		// no queue to wait in. (At 1 or 2 in flight, the time per
		// completion is that of a server kept idle, and read as a queue
		// it kept a cold pool whose base was too short at 0 or 1 in
		// flight of its 4 workers: TestColdOverloadVariedService.)
		expected = min(expected, l.baseNow.Load())
	}
	if !deadline.IsZero() && int64(deadline.Sub(now)) < expected {
		l.rejected[reasonDeadline].Add(1)
		return 0, ErrDeadline
	}
	if expected > l.threshold[c].Load() {
		l.rejected[reasonOverload].Add(1)
		return 0, ErrOverload
	}
	return expected, nil
}

// trialDue reports whether a request that the overload rule refuses,
// or that the suspect phase would hold, arriving at at, goes in all the
// same, as a trial: the server served no request successfully for as
// long as admitWaiter calls a hang (four mean latencies, at least
// maxWindows windows), nor did a trial go in. (Not failures: a tier
// whose own client still holds its dependency down fails fast what it
// admits, and hears of its return only through what it admits.)
//
// Both count what is in flight as a queue that a new request waits
// behind. Where it waits on something else (a dependency that hung, and
// the requests still hung in it until their deadlines), and everything
// new is refused or held, no request shows that the server would serve
// a new one at once: the completions are the hung requests ending, and
// the estimate stays until they are all gone. A middle tier refused or
// held every request for up to 700 ms after its dependency's hang had
// ended, in a quarter of the runs of bench hang-after-healthy, while the
// throttle above it, hearing only refusals, let few through. A trial
// served within the target ends the overload or the suspect phase
// (trialServed). Where the server does serve, however slowly, no trial
// is due; one that waits in a queue is served late, and ends nothing.
func (l *Limiter) trialDue(at int64) bool {
	every := l.hangAfter(l.lastMean.Load())
	if at-l.okAt.Load() <= every {
		return false
	}
	last := l.trialAt.Load()
	return at-last > every && l.trialAt.CompareAndSwap(last, at)
}

// trial admits a request at at as a trial if one is due (see trialDue),
// beyond the overload rule and the suspect phase's cap, never beyond
// Config.MaxInFlight: at the fixed cap, the turn goes back.
func (l *Limiter) trial(at int64) (Permit, bool) {
	if !l.trialDue(at) {
		return Permit{}, false
	}
	if !l.takeUnder(l.capAll) {
		l.trialAt.CompareAndSwap(at, 0)
		return Permit{}, false
	}
	p := l.permit(at, 0)
	p.trial = true
	return p, true
}

// trialServed ends the overload or the suspect phase: a request let in
// against them was served within the target, so what they counted as a
// queue is not one. If the server is overloaded after all, it becomes
// suspect again as at the start of any overload.
func (l *Limiter) trialServed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.overloaded.Load():
		l.endOverload()
	case l.suspect.Load():
		l.endSuspect()
	}
}

// holdRefusal waits, while an overload's probe runs, until it ends or
// ctx does, so that a closed loop's callers pause (see Limiter).
func (l *Limiter) holdRefusal(ctx context.Context) { l.probe.await(ctx) }

// await waits, while p holds, until it ends or ctx is done; else it
// returns at once. It takes no lock.
func (p *pause) await(ctx context.Context) {
	h := p.hold.Load()
	if h == nil {
		return
	}
	select {
	case <-*h:
	case <-ctx.Done():
	}
}

// take admits a request of class c if the requests in flight are below
// its cap.
func (l *Limiter) take(c Class, at int64) (Permit, bool) {
	lim := l.capOf(c)
	for cur := l.inflight.Load(); cur < lim; cur = l.inflight.Load() {
		if l.inflight.CompareAndSwap(cur, cur+1) {
			p := l.permit(at, 0)
			p.free = cur == 0
			return p, true
		}
	}
	return Permit{}, false
}

// permit returns the Permit of a request admitted at at, with the
// latency the overload rule expected for it.
func (l *Limiter) permit(at, expected int64) Permit {
	return Permit{l: l, start: at, expected: expected, cold: l.cold.admitted(at)}
}

// Outcome is how an admitted request ended, for Release.
type Outcome int

// The outcomes.
const (
	// Measured: the request was served, and its latency is a sample of
	// the server's latency without a queue.
	Measured Outcome = iota
	// Ignored: the request is no sign of the server's rate or latency (a
	// long-lived stream, a request whose caller left while it waited); it
	// frees its slot, and counts as neither an arrival nor a completion.
	Ignored
	// Failed: the request ended with an error. It counts as a completion,
	// but its latency is no sample: failures are often fast (a failing
	// dependency), and would make the server's latency without a queue
	// look shorter than it is.
	Failed
	// Abandoned: the request ended because its caller left while it ran
	// (its deadline ran out, or it cancelled; the server interceptor
	// releases so an answer that came after that, success or not), or
	// because a call it made ran out of time (a handler's
	// DeadlineExceeded: a dependency that hangs or is slow serves
	// nothing, and fails nothing fast). It counts as a completion
	// for the rates, as Failed does, but the server served nothing: a
	// server whose requests all end at their callers' deadlines (a hang
	// below it) is neither failing fast nor calm, however many end. Read
	// as Failed, a hang's first deadlines made a server that held a
	// second of arrivals send them all into the hang at once.
	Abandoned
)

// Permit is an admitted request. The zero Permit is valid and does
// nothing.
type Permit struct {
	l     *Limiter
	start int64
	// expected: the latency the overload rule expected when it admitted
	// the request (see checkModel); 0 for one admitted without it.
	expected int64
	cold     bool // counted by the cold start (see coldStart)
	free     bool // admitted with nothing else in flight: it waited behind no one (see freeMean)
	trial    bool // let in against the overload rule or the suspect phase (see trialDue)
	held     bool // admitted by a suspect phase whose cap grew on the work's evidence (see Held)
	above    bool // held above, admitted while the server was suspect (counted in heldIn)
}

// Trial reports whether the request was let in as a trial against the
// overload rule or the suspect phase, after nothing was served for a
// while (see trialDue). A handler's calls on behalf of a trial should
// reach a dependency its client holds down, as a probe (the interceptor
// asks adaptive.Throttle.AllowTrial, and marks the calls for the tiers
// below): refused there, the trial shows nothing.
func (p Permit) Trial() bool { return p.trial }

// Held reports whether the request was admitted by the suspect phase of
// Wait (see Limiter) under the cap of a server that held back what
// exceeded it, at once or after it waited, once that cap had grown
// because the server's work became slower rather than queued
// (slowerWork in suspect.go: it serves some requests fast while its
// slots complete slowly). Not a waiter let in beyond the cap because
// its deadline came close, nor the waiters let in at once when the
// phase ends: the cap bounds neither. The tiers below wait on the same slow work, and need not hold
// such a request again: this tier's cap bounds what it sends them (see
// WaitHeld; the interceptor marks the calls for the tiers below). A
// request held because the server queues is not marked: the tier whose
// queue it is holds its own (a CPU-bound chain whose gateway, starved
// of CPU, ended its suspect phases calm by chance, marked everything
// and let the middle tier's queue grow to thousands: busy's
// overload-cpu collapsed in 3 of 5 runs, against none).
func (p Permit) Held() bool { return p.held }

// Release ends the request: it frees its slot and counts it as Outcome
// o. Call it exactly once per admitted request, and HoldAnswer after
// it when an answer goes out (not for a request whose caller left).
func (p Permit) Release(o Outcome) {
	l := p.l
	if l == nil {
		return
	}
	// Ignored: neither an arrival nor a completion (a stream's start, or
	// a request whose caller left while it waited, adds no work to
	// compare). Abandoned: a completion that served nothing.
	if p.above {
		// Before inflight: between the two, takeUnheld would count one
		// more of the server's own in flight, never one fewer.
		l.heldIn.Add(-1)
	}
	l.inflight.Add(-1)
	if p.trial && o == Ignored {
		// A trial that showed nothing (a stream's start, which holds no
		// slot, or a request whose caller left before it ran) gives its
		// turn back: the next request refused may be the trial. (0 is
		// due: a trial needs at-okAt, and so at, above the interval.)
		l.trialAt.CompareAndSwap(p.start, 0)
	}
	if p.cold {
		l.cold.released(p.start, max(l.now()-p.start, 0), o)
	}
	if o == Measured || o == Failed || o == Abandoned {
		at := l.now()
		if g := l.grew.Load(); g != nil && o != Failed && p.start >= g.at {
			g.n.Add(1)
		}
		if o == Abandoned {
			l.abandoned.Add(1)
			if at-p.start >= l.baseNow.Load() {
				l.wasted.Add(1) // a slot a service time long, for no one
			}
		}
		if o == Measured {
			rtt := max(at-p.start, 0)
			l.latSum.Add(rtt)
			l.latN.Add(1)
			l.okAt.Store(at)
			if p.trial && rtt <= l.threshold[ClassFirst].Load() {
				l.trialServed()
			}
			lower(&l.least, rtt)
			if l.suspect.Load() && p.start >= l.suspectFrom.Load() {
				l.suspSum.Add(rtt)
				l.suspN.Add(1)
				b := l.baseNow.Load()
				if rtt <= b {
					l.roomSeen.Store(true)
				}
				if rtt <= 2*b {
					l.fastSeen.Store(true)
				}
			}
			if j := l.judging.Load(); p.start >= j.from {
				lower(&j.least, rtt)
			}
			if p.free && l.overloaded.Load() {
				if f := l.free.Load(); p.start >= f.from {
					f.sum.Add(rtt)
					f.n.Add(1)
				}
			}
			if p.expected > 0 {
				l.mdl.add(rtt, p.expected)
			}
		} else if o == Failed {
			l.failed.Add(1)
		}
		if o != Abandoned {
			l.servedAt.Store(at)
		}
		if at >= l.winEnd.Load() {
			l.roll(at)
		}
	}
	if l.suspect.Load() {
		l.dispatchSuspect()
	}
	if l.cfg.QueueSize > 0 && l.waiting() > 0 {
		l.dispatch()
	}
}

// lower stores rtt (at least 1) in v if v is 0 or larger.
func lower(v *atomic.Int64, rtt int64) {
	for cur := v.Load(); cur == 0 || rtt < cur; cur = v.Load() {
		if v.CompareAndSwap(cur, max(rtt, 1)) {
			return
		}
	}
}

// roll ends the window when it is due at at: it records what the window
// saw, updates the estimates, and starts or ends the overload.
func (l *Limiter) roll(at int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := int64(l.cfg.Window)
	if at < l.winStart {
		l.winStart = at // a clock that went back
	}
	if at < l.winEnd.Load() {
		return // another caller rolled meanwhile
	}
	cur := l.counters()
	d := snapshot{cur.arrived - l.last.arrived, cur.refused - l.last.refused, cur.done - l.last.done,
		cur.latSum - l.last.latSum, cur.latN - l.last.latN, cur.gone - l.last.gone, cur.abandoned - l.last.abandoned, cur.wasted - l.last.wasted}
	dur := at - l.winStart
	if d.arrived+d.refused+d.done < minEvents && dur < maxWindows*w {
		l.winEnd.Store(at + w/2)
		return
	}
	win := window{dur: max(dur, 1), arrived: d.arrived, refused: d.refused, done: d.done, gone: d.gone, abandoned: d.abandoned, wasted: d.wasted,
		inflight: l.inflight.Load(), over: l.overloaded.Load(), least: l.least.Swap(0), latSum: d.latSum, latN: d.latN}
	if win.latN >= minSamples {
		l.lastMean.Store(win.mean())
	} else if win.latN > 0 && l.lastMean.Load() == 0 {
		// No mean yet: the mean of these few stands in (admitWaiter
		// reads it), and later windows correct it as above or below.
		l.lastMean.Store(win.latSum / win.latN)
	} else if last := l.lastMean.Load(); last > 0 && win.least > last {
		// Too few successes for a mean, but even the fastest of them
		// took longer: the mean of before is stale (a server that became
		// slower completes few).
		l.lastMean.Store(win.least)
	}
	l.record(win)
	l.last, l.winStart = cur, at
	l.winEnd.Store(at + w)
	per, stalled := l.timePerDone()
	l.perDone.Store(per)
	l.stalled.Store(stalled)
	late := false
	for i := range min(rateWindows, l.histN) {
		late = late || l.recent(i).abandoned > 0
	}
	l.lateLately.Store(late)
	if l.floorFor > 0 && !l.overloaded.Load() {
		l.floorFor-- // checkModel's floor lasts historyWindows windows outside an overload
	}
	keep := l.cold.update(at, win.inflight, l.perDone.Load())
	switch {
	case l.cold.floor > l.base && l.suspect.Load():
		// A cold start's base found while the server is suspect: its
		// cap (twice the completion rate times the base) held what it
		// filled up with (see coldStart).
		l.base = l.cold.floor
		l.setThresholds()
	case keep > 0:
		// The cold start's base stands until the history has turned
		// over, as checkModel's does.
		l.floor, l.floorFor = max(l.floor, keep), historyWindows
	}
	switch {
	case l.overloaded.Load():
		l.recordHeld(win.inflight)
		l.whileOverloaded(win, at)
	case l.suspect.Load():
		l.whileSuspect(win)
	default:
		l.recordHeld(win.inflight)
		l.whileNot(win)
	}
}

// record adds win to the history as its latest window, queued if the
// server is suspect, busy if the arrivals of the last rateWindows
// windows, win's included, exceeded their completions. l.mu is held.
func (l *Limiter) record(win window) {
	win.queued = l.suspect.Load()
	l.hist[l.histAt] = win
	l.histAt = (l.histAt + 1) % historyWindows
	l.histN = min(l.histN+1, historyWindows)
	l.recent(0).busy = !l.calmLately()
}

// recent returns the i-th most recent window (0: the last one). l.mu is
// held; i < l.histN.
func (l *Limiter) recent(i int) *window {
	return &l.hist[(l.histAt-1-i+2*historyWindows)%historyWindows]
}

// timePerDone returns the nanoseconds per completion over the last
// rateWindows windows, 0 when none completed, and then the windows'
// length as stalled. l.mu is held.
func (l *Limiter) timePerDone() (per, stalled int64) {
	var dur, done int64
	for i := range min(rateWindows, l.histN) {
		w := l.recent(i)
		dur += w.dur
		done += w.done
	}
	if done == 0 {
		return 0, dur
	}
	return dur / done, 0
}

// whileNot is the window's end while the server is not overloaded: the
// base, and the start of an overload. l.mu is held.
func (l *Limiter) whileNot(win window) {
	// The base is the mean latency of all the successes in the history,
	// not the least of the windows' means: a window holds a few
	// successes, and where latencies spread (a handler that waits on a
	// dependency or a database) the least of 128 such means is a
	// fraction of the mean. Little's law's expected latency is a mean,
	// so against a base of a quarter of it a server that queued nothing
	// looked overloaded once it was, and refused until its admitted
	// requests were too few to keep it busy, for as long as the load
	// lasted: 64 workers of 100 ms on average (exponential), at twice
	// their capacity after healthy traffic, were admitted 101-128 of
	// their 640 requests a second and refused 33-88 % of the half load
	// after it (TestSpreadLatencyOverloadEnds). Not from fewer than minSamples
	// successes: a base from the first success or two made a cold
	// server suspect in a load test's ramp, and held its callers (p99
	// at 128 callers 1.2x).
	mean, keep := l.pooledMean()
	base := max(mean, l.cold.floor) // at a cold start, see coldStart
	if l.floorFor > 0 {
		base = max(base, l.floor)
	}
	if !keep && base != 0 && base != l.base {
		// With no sample in the history (an outage whose requests all
		// failed), the last base stays.
		l.base = base
		l.setThresholds()
	}
	if l.growing(win) {
		l.growthRun++
	} else {
		l.growthRun = 0
	}
	if l.growthRun < 1 {
		return
	}
	// The growth must go past the most in flight before it began.
	highest := int64(0)
	for i := l.growthRun; i < l.histN; i++ {
		highest = max(highest, l.recent(i).inflight)
	}
	// A server with no base yet (fewer than minSamples successes seen,
	// or at a cold start no verdict yet on whether it fills up or
	// queues: see coldStart) cannot tell its latency from a queue: it
	// holds no one until it has one.
	// Nor does a server whose requests all failed in the window: it is
	// failing, not busy, and holding its callers would only delay their
	// failure (or send them all at once when it recovers). But at a
	// cold start, a window that completed only requests served too late
	// for their callers (Abandoned), while more arrived than completed,
	// is a queue past its callers' deadlines, built while the cold start
	// could not yet tell (see coldStart), not a failure: read as one, a
	// pool overloaded from its start (1 worker of 100 ms at 4x, 1 s
	// deadlines) was never suspect again, with 600 in flight. Not later:
	// a hang below a warm server completes about as many as arrive, at
	// their deadlines, and a window not calm by chance made it suspect
	// and refuse its healthy traffic after the hang.
	per := l.perDone.Load()
	if l.base == 0 || l.cold.undecided() || win.least == 0 && !(l.cold.on.Load() && lateOnly(win)) || win.inflight <= highest+growthMargin || per == 0 || (win.inflight+1)*per <= l.threshold[ClassFirst].Load() {
		return
	}
	l.becomeSuspect(win, per)
}

// lateOnly reports whether win completed requests, all of them
// Abandoned, while its arrivals exceeded its completions (see whileNot).
func lateOnly(win window) bool {
	return win.done > 0 && win.abandoned == win.done && !calm(win)
}

// pooledMean returns the mean latency of the successes in the history's
// windows outside an overload, 0 for fewer than minSamples: of the calm
// ones (not busy) if they hold minSamples, else of all; or keep (the
// base stays) while the history holds an overload's windows and no calm
// ones, and the server has a base. A queue that
// builds raises the latency of what completes; taken as the base, it
// raised the threshold with it, so that what the server held never
// looked like a queue again: a starved tier whose overload had ended
// followed its queue to 909 ms with 7 768 in flight, and was never
// suspect again (busy's CPU-bound overload;
// TestBaseIgnoresAGrowingQueue). A server that became slower is calm
// again once what it holds matches its new latency, and its base follows
// from then on; one with no calm window yet (a cold start that fills
// up) takes what it has. Not a server whose history holds an overload:
// right after one, it holds only the overload's windows and the busy
// ones after it, and a gateway's base went from 1.3 to 26 ms in one
// window, its queue's latency (TestBaseKeptAfterAnOverload). l.mu is
// held.
func (l *Limiter) pooledMean() (mean int64, keep bool) {
	var sum, n, calmSum, calmN int64
	overload := false
	for i := range l.histN {
		w := l.recent(i)
		overload = overload || w.over
		if !w.over && !w.queued {
			sum, n = sum+w.latSum, n+w.latN
			if !w.busy {
				calmSum, calmN = calmSum+w.latSum, calmN+w.latN
			}
		}
	}
	switch {
	case calmN >= minSamples:
		return calmSum / calmN, false
	case overload && l.base != 0:
		return 0, true
	case n < minSamples:
		return 0, false
	}
	return sum / n, false
}

// growing reports whether the arrivals exceed the completions in win,
// or, while a growth runs, in the windows since it began: a server that
// became slower completes nothing in its first window and then the
// requests that waited, and each of the two windows alone can look calm
// (a slow dependency at 240/s: suspect only at 31 in flight instead of
// 17). l.mu is held; win is l.recent(0).
func (l *Limiter) growing(win window) bool {
	sum := window{arrived: win.arrived, done: win.done}
	if !calm(sum) {
		return true
	}
	for i := 1; i <= l.growthRun && i < l.histN; i++ {
		w := l.recent(i)
		sum.arrived += w.arrived
		sum.done += w.done
	}
	return !calm(sum)
}

// calm reports whether the window's arrivals, refused ones included, did
// not exceed its completions by more than a growth: a closed loop's
// arrivals follow its completions, one for one within the noise of where
// a window ends.
func calm(win window) bool {
	return float64(win.arrived+win.refused) < (1+growthShare)*float64(win.done)+growthMargin
}

// calmLately is calm over the last rateWindows windows together: a few
// windows of a server at low rates hold a handful of events each, and
// two in a row can look calm by chance in an open loop at three times
// its capacity. l.mu is held.
func (l *Limiter) calmLately() bool { return l.calmOver(false, rateWindows) }

// calmOver is calm over the last n windows together, counting as
// completions only the requests served (not Abandoned) when served is
// true. l.mu is held.
func (l *Limiter) calmOver(served bool, n int) bool {
	var sum window
	for i := range min(n, l.histN) {
		w := l.recent(i)
		sum.arrived += w.arrived
		sum.refused += w.refused
		sum.done += completions(*w, served)
	}
	return calm(sum)
}

// completions returns the window's completions, only those served when
// served is true.
func completions(w window, served bool) int64 {
	if served {
		return w.done - w.abandoned
	}
	return w.done
}

// whileOverloaded is the window's end while the server is overloaded:
// its end, and the probes. l.mu is held.
//
// While it serves, it is calm by what it served: a request its caller
// left frees a slot, but is no sign that the server keeps up. Counted,
// the requests admitted a deadline ago, which end together at that
// deadline, made a gateway at eight times its chain's capacity look calm
// a second into the overload: the overload ended, a suspect phase of
// 600 ms held its arrivals, and again a deadline later (p99 of successes
// 150-600 ms, and a throttle below that called its target down). A
// server that served nothing lately (a hang below it, whose requests
// all end at their deadlines) has no served rate to compare with: it is
// calm by all its completions, as before. Nor does one that refused
// nothing lately: it admits every arrival, so a wave of requests its
// callers left is no excess it hides, and a steady share of them (40 %
// cancelled) kept an overload from ever ending by what was served.
func (l *Limiter) whileOverloaded(win window, at int64) {
	l.overSince++
	if l.pending && l.verdict(false) {
		return // a closed loop's: the server is suspect again
	}
	l.checkModel(at)
	l.followService()
	served := l.servedLately() && l.refusedLately()
	// The server is calm too once what is offered, refused requests
	// included, falls well below the rate it served at during this
	// overload, while it serves and has room: at a low rate after an
	// overload (a pool of 8 workers of 50 ms on average, exponential, at
	// half its capacity), the time per completion is the time between
	// the few requests the rule admits, and the more it refused, the
	// longer that time, the longer the latency it expected, and the more
	// it refused; the refusals, counted as arrivals, kept every window
	// from being calm. It refused 80-90 % of the half load for as long as
	// it lasted after 4 of 24 overloads (TestLowRateOverloadEnds). The
	// room tells it from a server that became slower and keeps its queue
	// (TestSlowerServerKeepsOverload).
	l.overServed += win.latN
	l.overDur += win.dur
	if l.belowServed(win) {
		l.belowRun++
	} else {
		l.belowRun = 0
	}
	switch {
	case win.arrived+win.refused == 0 && win.inflight > 0:
		// Nothing arrived, not even to be refused, while requests are
		// in flight: no sign of the load either way. A tier starved of
		// CPU (every tier of a chain on two busy cores) reads its
		// callers' connection late and sees whole windows of nothing
		// but the completions of what it holds, all too late for their
		// callers; two of them read as calm, ended the overload, and the
		// tier admitted everything until its callers' deadlines ended
		// it (busy's CPU-bound overload: a quarter of the runs at
		// 0.11-0.28x of capacity; TestStarvedWindowsKeepTheOverload). A
		// load that ended leaves nothing to refuse, and its next
		// arrivals, calm, end the overload.
	case calm(window{arrived: win.arrived, refused: win.refused, done: completions(win, served)}) && l.calmOver(served, rateWindows):
		l.calmRun++
	default:
		l.calmRun = 0
	}
	if l.calmRun >= calmWindows || l.belowRun >= calmWindows {
		l.endOverload()
		return
	}
	if !l.probe.on && l.overSince%probeEvery == 0 {
		l.startProbe(at)
	}
}

// idleWorkers returns how many requests the server holds, during an
// overload, before its workers are all busy: its base (the latency
// without a queue, before the overload) over the time per completion of
// the suspect phase before the overload, whose waiters held it
// saturated (Little's law: the concurrency at which it completes at
// that rate without a queue); 0 when unknown. Below that many in
// flight, a new request finds a free worker, and the overload rule
// expects no more than the base for it.
//
// Little's law as the rule applies it ((in flight + 1) x the time per
// completion of the last windows) holds only while the server is
// saturated: below that, the time per completion is the time between
// the few completions of what the rule admits, the longer the less it
// admits, and so is the latency it expects, which refused more the
// more it refused: a pool of 8 workers of 50 ms on average
// (exponential: 160/s) at 4 times its capacity for 3 s was served
// 116-168/s in time, 146/s on average over 8 seeds; counting its free
// workers, 153-171/s, 158/s (TestOverloadKeepsIdleWorkersBusy).
//
// The count is taken when the overload begins, and stands until it
// ends. Recounted with the base that checkModel raises (or the one
// followService publishes), a server that became slower during the
// overload had ever more workers counted against the rate of before;
// each request below that count was admitted however long the queue,
// the queue did not follow what the rule expected, and checkModel
// raised the base again (a review's simulation: 16 workers of 20 ms on
// average at 2x, 5 times slower from 2 s: p99 1 928 ms, a runaway queue
// in 15 of 16 seeds, against 647 ms; 64 workers cut to 16: 1 025 in
// flight where the rule held 35;
// TestSlowerDuringOverloadCountsNoMoreWorkers). A server whose base is
// too short (a pool overloaded from its first request, whose first
// answers are its fastest) counts too few, until the requests admitted
// with nothing in flight tell its latency (followService raises the
// count then, for the rest of the overload: a server that becomes
// faster during it keeps the higher count, bounded by baseDrift). l.mu
// is held.
func (l *Limiter) idleWorkers() int64 {
	if l.perFull <= 0 {
		return 0
	}
	return l.base / l.perFull
}

// belowServed reports whether the requests offered over the last
// rateWindows windows, refused ones included, came at less than
// belowShare of the rate the server served at over this overload (its
// successes over its windows' time: a mean, which bursts of completions
// and long windows move little), while it served
// some lately, and whether it has room: fewer in flight, at the end of
// win, than that rate needs without a queue (the rate times the base).
// Then it had room for what it refused. Not failures, which a server
// may answer faster than it serves. l.mu is held.
func (l *Limiter) belowServed(win window) bool {
	if l.overDur <= 0 || l.overServed == 0 {
		return false
	}
	var dur, offered, served int64
	for i := range min(rateWindows, l.histN) {
		w := l.recent(i)
		dur += w.dur
		offered += w.arrived + w.refused
		served += w.latN
	}
	rate := float64(l.overServed) / float64(l.overDur) // per nanosecond
	room := float64(win.inflight) < rate*float64(l.base)
	return dur > 0 && served >= minSamples && room && float64(offered)/float64(dur) < belowShare*rate
}

// refusedLately reports whether the server refused a request in the
// last rateWindows windows. l.mu is held.
func (l *Limiter) refusedLately() bool {
	for i := range min(rateWindows, l.histN) {
		if l.recent(i).refused > 0 {
			return true
		}
	}
	return false
}

// followService moves the thresholds with the server's latency without a
// queue while it is overloaded: a server that became slower (a slow
// dependency, a degraded disk) rather than queued needs more time per
// request, and with the base of before the overload it would be refused
// work its idle workers could do.
//
// The least latency of the last windows is that of a request that
// hardly waited, where the queue empties. Where it never does (a pool
// that stays backed up, or the tiers below a gateway, fed by what the
// gateway admits) it includes a wait, and a base that followed it would
// admit more, lengthen the wait, and follow again: at a gateway at 8x
// its chain's capacity, up to baseDrift times the base of before (11 ms
// -> 87 ms, p99 of successes 140 ms). So the base follows only a latency
// that stays when the queue is short. While it does not follow, the
// thresholds are those of before, which admit a request only when its
// expected latency is within the base plus the target; a judgement
// takes the least latency of the requests admitted since it began (at
// least rateWindows windows, until one of them is served). If that
// exceeds the base plus followMargin targets, no queue those thresholds
// allow explains it, and the base follows the least latency of the last
// windows, up to the least latency the judgement saw (what the server
// takes without the queue that following adds: at a gateway in front of
// a saturated pool, a base that followed on up drifted while it
// followed: in busy's overload at 8x, p99 of successes per second up to
// 106 ms, 36-71 ms with the bound) and baseDrift times the base of
// before (8: the slow dependency of the scenarios is 5 times slower);
// if not, a new judgement begins. After followFor windows of following
// it stops, to be judged again. l.mu is held.
func (l *Limiter) followService() {
	least := int64(0)
	for i := range min(rateWindows, l.histN) {
		if w := l.recent(i); w.least > 0 && (least == 0 || w.least < least) {
			least = w.least
		}
	}
	margin := l.base + int64(followMargin*float64(l.cfg.Target))
	if l.following {
		if l.followed++; l.followed >= followFor {
			l.following = false
			l.startJudging()
		}
	} else if l.judged++; l.judged >= rateWindows {
		switch j := l.judging.Load().least.Load(); {
		case j > margin:
			l.following, l.followed, l.followTo = true, 0, j
		case j > 0:
			l.startJudging()
		}
	}
	base := l.base
	if l.following && least > base {
		base = min(least, l.followTo, baseDrift*l.base)
	}
	// The requests admitted with nothing else in flight waited behind
	// no one: the mean of their latencies is the server's without a
	// queue, whatever their spread. Where it exceeds the base by more
	// than the margin, the base is too short (a pool overloaded from
	// its first request, whose first answers were its fastest: as low
	// as 8 ms for 50 ms on average), and so are the workers counted idle by it;
	// both follow the mean. Not the least latency: with latencies that
	// spread, the least of a few is near nothing.
	if free := l.freeMean(); free > margin {
		base = max(base, min(free, baseDrift*l.base))
		if l.perFull > 0 {
			l.idleUnder.Store(max(l.idleUnder.Load(), base/l.perFull))
		}
	}
	l.publishThresholds(base)
}

// checkModel checks the overload rule's model of the server against what
// the requests it admitted took: Little's law expects (in flight + 1) x
// (time per completion) of a server that queues, whose completion rate
// is its capacity, and so whose requests take longer the more are in
// flight. A server that waits (on a dependency, a database), with room
// for more, completes in proportion to what it is given, and its
// requests take their latency whatever is in flight; with a base below
// that latency (the mean of its first, fastest answers at a cold start:
// a spread latency's slowest have not come back yet) the rule refuses
// until too few are admitted to keep it busy, and its completions fall
// with them: it would stay overloaded for as long as the load lasts
// (TestWaitingServerColdStartEnds: a server waiting 100 ms on average
// refused 92 % of an open loop at 1 000/s from its third second on).
// So the requests it admits are checked in batches of modelSamples
// served. A batch does not fit the rule when its requests took more on
// average than the rule expected for them plus the target, and what
// each took does not follow what the rule expected for it (Pearson's r
// at most modelCorr): at a server that queues, a request admitted
// behind more in flight takes longer, however noisy the estimate (the
// rule admits most where the time per completion reads short, so its
// requests take 15-25 % longer than expected, and a check on the means
// alone raised the base of a queue of 5 ms requests check after check,
// to 1.5 s: review of 1ac407c, TestQueueingServerKeepsItsBase). When
// modelChecks batches in a row did not fit, over at least twice what they
// took, the rule does not describe the server: its base becomes what
// they took, and whileNot keeps it as the least base for historyWindows
// windows, while the history of before still holds the early answers.
// In a row and for that long, because a pause of the whole process (a
// GC, a CPU quota) makes the requests admitted around it take the pause,
// once: counted alone, a 300 ms pause during an overload raised the base
// of 20 ms requests to 586-657 ms (TestPauseKeepsTheBase); two pauses of
// a second each, 2 s apart, still do (a known limit). Expectations that
// hardly vary, as those of requests admitted while nothing completed
// (each expects the base), count as not followed (r = 0): they are a
// cold start's only evidence. The span is from the first check that
// did not fit, so it leaves out the first batch's own time.
//
// A server that waits hundreds of milliseconds admits a batch of
// modelSamples in a fraction of its latency, and sixteen samples of a
// spread latency are too few to fail the check twice in a row: their
// mean moves by a quarter of the latency from batch to batch, and its
// base, somewhat below its latency, kept it refused for good (a server
// waiting 300 ms on average, open loop at 1 000/s from cold: in 4 of 16
// seeds still refusing after 14 s; TestWaitingServerColdStartEnds/300ms).
// So a second, long batch is judged in the same way, with its own
// streak: it also spans twice what its requests took (its streak's own
// span then matters only when the first batch took longer). The price:
// a pool of slow requests that really queues (64 workers of 300 ms on
// average at 4x their capacity) has its base raised to about twice its
// latency. (At 2x such a pool's base follows its queue, long batch or
// not, by another way: the admission doc's known limits.) l.mu is held.
func (l *Limiter) checkModel(at int64) {
	l.mdl.mu.Lock()
	short := l.mdl.short.take(at, false)
	long := l.mdl.long.take(at, true)
	l.mdl.mu.Unlock()
	mean := max(l.judgeBatch(short, &l.mdl.streak, at), l.judgeBatch(long, &l.mdl.longStreak, at))
	if mean > l.base {
		l.base, l.floor, l.floorFor = mean, mean, historyWindows
		l.mdl.streak, l.mdl.longStreak = streak{}, streak{}
	}
}

// judgeBatch adds batch b to the streak st of batches that did not fit
// the rule, and returns the mean of what the streak's requests took
// once it is long enough to raise the base, else 0 (see checkModel).
// l.mu is held.
func (l *Limiter) judgeBatch(b batch, st *streak, at int64) int64 {
	if b.n == 0 {
		return 0
	}
	if b.r > modelCorr || b.took/b.n <= b.expected/b.n+int64(l.cfg.Target) {
		*st = streak{}
		return 0
	}
	if st.checks == 0 {
		st.since = at
	}
	st.checks++
	st.took += b.took
	st.n += b.n
	mean := st.took / st.n
	if st.checks < modelChecks || at-st.since < 2*mean {
		return 0
	}
	*st = streak{}
	return mean
}

// model is checkModel's samples: the requests admitted by the overload
// rule and served, what they took and what the rule expected for them,
// in two batches: a short one of modelSamples, and a long one that also
// spans twice what its requests took (a server that waits hundreds of
// milliseconds, whose short batches are too few samples of its spread
// to fit or not fit twice in a row). Release adds to both without l.mu;
// one lock keeps them together.
type model struct {
	mu          sync.Mutex
	short, long sums
	// Guarded by l.mu, not mu: the batches in a row that did not fit.
	streak, longStreak streak
}

// sums is a batch of samples (nanoseconds, summed).
type sums struct {
	took, expected, num int64
	// In seconds, for the correlation of took and expected: their
	// squares and products, summed.
	tt, ee, te float64
	from       int64 // nanoseconds since origin: when a long batch began
}

// batch is a batch taken: what its requests took and what the rule
// expected for them (summed), how many, and Pearson's r of the two.
type batch struct {
	took, expected, n int64
	r                 float64
}

// streak is the checks in a row in which the server did not behave as
// the overload rule expects: since when (nanoseconds since origin), how
// many, and what their requests took (summed) and how many.
type streak struct {
	since, checks, took, n int64
}

func (m *model) add(took, expected int64) {
	t, e := time.Duration(took).Seconds(), time.Duration(expected).Seconds()
	m.mu.Lock()
	m.short.add(took, expected, t, e)
	m.long.add(took, expected, t, e)
	m.mu.Unlock()
}

func (s *sums) add(took, expected int64, t, e float64) {
	s.took += took
	s.expected += expected
	s.num++
	s.tt += t * t
	s.ee += e * e
	s.te += t * e
}

// take returns the batch and starts anew at at (now, nanoseconds since
// origin) when it holds modelSamples samples, and, if long, spans twice
// what they took on average; else it returns a batch of none. m.mu is
// held.
func (s *sums) take(at int64, long bool) batch {
	if s.num < modelSamples || long && at-s.from < 2*(s.took/s.num) {
		return batch{}
	}
	b := batch{took: s.took, expected: s.expected, n: s.num}
	fn := float64(b.n)
	mt, me := time.Duration(b.took).Seconds()/fn, time.Duration(b.expected).Seconds()/fn
	cov := s.te/fn - mt*me
	vt, ve := s.tt/fn-mt*mt, s.ee/fn-me*me
	// Expectations that hardly vary (most admitted while nothing
	// completed, expecting the base) cannot follow the latencies:
	// r = 0; nor can latencies that hardly vary follow them.
	if vt > 1e-6*mt*mt && ve > 1e-6*me*me {
		b.r = cov / math.Sqrt(vt*ve)
	}
	*s = sums{from: at}
	return b
}

// reset drops the samples and the streaks; the long batch begins at at.
func (m *model) reset(at int64) {
	m.mu.Lock()
	m.short, m.long = sums{}, sums{from: at}
	m.mu.Unlock()
	m.streak, m.longStreak = streak{}, streak{}
}

// freeMean returns the mean latency of the successes admitted with
// nothing else in flight since the overload began, 0 with fewer than
// freeSamples of them (followService).
func (l *Limiter) freeMean() int64 {
	f := l.free.Load()
	n := f.n.Load()
	if n < freeSamples {
		return 0
	}
	return f.sum.Load() / n
}

// freeLatencies are the latencies of the successes admitted with nothing
// else in flight since an overload began (from). A new overload stores
// a new value, so that a request released while one begins adds to the
// sums it belongs to, never to the next one's.
type freeLatencies struct {
	from   int64        // nanoseconds since origin
	sum, n atomic.Int64 // nanoseconds, and their number
}

// startJudging starts a judgement of followService: the least latency of
// the requests admitted from now on. l.mu is held.
func (l *Limiter) startJudging() {
	l.judged = 0
	l.judging.Store(&judgement{from: l.now()})
}

// judgement is one judgement of followService: the least Measured
// latency of the requests admitted from a time on. A new judgement is a
// new value, so that a request released while one starts lowers the
// judgement it belongs to, never the next one.
type judgement struct {
	from  int64        // nanoseconds since origin
	least atomic.Int64 // 0: none
}

// endOverload ends the overload, and a probe with it. l.mu is held.
func (l *Limiter) endOverload() {
	l.overloaded.Store(false)
	if l.pending {
		// Ended before its verdict: its waiters are refused, as they
		// were at an overload's start before there was a verdict. Let
		// in, they were a backlog that the load after a starved tier's
		// overload waited behind (a review's simulation: 787 of it
		// served late, none in time).
		l.pending = false
		l.spinCheck.Store(0)
		l.releaseSuspect(false)
	}
	l.setThresholds()
	l.growthRun, l.calmRun, l.belowRun, l.overServed, l.overDur = 0, 0, 0, 0, 0
	l.probe.stop()
}

// startProbe starts a probe: refusals are held for probeWindows windows,
// and the offered arrivals of the second half compared with those before
// (see Limiter). l.mu is held.
func (l *Limiter) startProbe(at int64) {
	rate := l.offeredRate(rateWindows)
	if rate == 0 {
		return
	}
	// Each half lasts a window, or long enough to expect probeArrivals
	// arrivals at the rate of before, so that a fall by half is not
	// chance (at 32 expected, fewer than 16 come about once in a
	// thousand probes).
	half := max(time.Duration(probeWindows*l.cfg.Window/2), time.Duration(probeArrivals/rate))
	half = min(half, MaxWindow)
	l.probe.begin(l, rate, half, l.endProbe)
}

// endProbe ends the probe that holds h: a closed loop ends the overload.
func (l *Limiter) endProbe(h *chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if fell, ok := l.probe.end(l, h); ok && fell {
		// The callers paused when their refusals did: a closed loop.
		l.endOverload()
	}
}

// pause is a probe that tells a closed loop of callers from an open one
// without refusing more: what the callers wait for (an overload's
// refusals, a suspect phase's answers) waits on the channel in hold
// (await), and the offered arrivals of its second half are compared
// with the rate before. A closed loop's callers send again only once
// answered: their arrivals fall; an open loop's do not. Guarded by
// l.mu, but for hold.
type pause struct {
	hold  atomic.Pointer[chan struct{}] // while it runs: closed when it ends
	on    bool
	rate  float64       // offered arrivals per nanosecond before it
	half  time.Duration // the length of each half
	mid   int64         // when its second half began; 0: not yet
	start snapshot      // the counters then
}

// begin starts p (ending the run before, if one is on), with offered
// arrivals at rate before it: half-way after half, and end is called
// after 2 x half with its channel, without l.mu (it takes it). l.mu is
// held.
func (p *pause) begin(l *Limiter, rate float64, half time.Duration, end func(*chan struct{})) {
	p.stop()
	p.on, p.rate, p.half, p.mid = true, rate, half, 0
	h := make(chan struct{})
	p.hold.Store(&h)
	l.afterFunc(half, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if p.holds(&h) {
			p.start = l.counters()
			p.mid = l.now()
		}
	})
	l.afterFunc(2*half, func() { end(&h) })
}

// holds reports whether p runs, holding h. l.mu is held.
func (p *pause) holds(h *chan struct{}) bool {
	return p.on && p.hold.Load() == h
}

// end ends p if it runs holding h (ok), and reports whether the offered
// arrivals since its half-way point came at less than closedRatio times
// the rate before it (fell). Not without a half-way point, nor over a
// second half shorter than half what it should be: a process that
// stalled past both timers runs them in either order, or microseconds
// apart, and nothing arrives between. l.mu is held.
func (p *pause) end(l *Limiter, h *chan struct{}) (fell, ok bool) {
	if !p.holds(h) {
		return false, false
	}
	offered := p.offered(l)
	dur := l.now() - p.mid
	fell = p.mid > 0 && dur >= int64(p.half)/2 && float64(offered)/float64(dur) < closedRatio*p.rate
	p.stop()
	return fell, true
}

// surelyOpen reports whether p runs and its second half has already
// seen the offered arrivals that make its end find no fall (see end):
// closedRatio times the rate before over the half. l.mu is held.
func (p *pause) surelyOpen(l *Limiter) bool {
	return p.on && p.mid > 0 && float64(p.offered(l)) >= closedRatio*p.rate*float64(p.half)
}

// offered returns the requests offered (arrived or refused) since p's
// half-way point. l.mu is held.
func (p *pause) offered(l *Limiter) int64 {
	c := l.counters()
	return (c.arrived + c.refused) - (p.start.arrived + p.start.refused)
}

// stop ends p, if it runs: its channel is cleared and closed, and
// whoever waits on it goes on. l.mu is held.
func (p *pause) stop() {
	if !p.on {
		return
	}
	p.on, p.mid = false, 0
	if h := p.hold.Swap(nil); h != nil {
		close(*h)
	}
}

// offeredRate returns the requests offered (arrived or refused) per
// nanosecond over the last n windows, 0 for none. l.mu is held.
func (l *Limiter) offeredRate(n int) float64 {
	var dur, offered int64
	for i := range min(n, l.histN) {
		w := l.recent(i)
		dur += w.dur
		offered += w.arrived + w.refused
	}
	if dur == 0 {
		return 0
	}
	return float64(offered) / float64(dur)
}

// waiting returns the requests in the queue or about to enter it.
func (l *Limiter) waiting() int64 { return l.waitingN.Load() }

// Limit returns Config.MaxInFlight, the fixed cap (0: none).
func (l *Limiter) Limit() int { return int(l.capAll) }

// InFlight returns the number of admitted requests not yet released.
func (l *Limiter) InFlight() int { return int(l.inflight.Load()) }

// Overloaded reports whether the server is overloaded now: requests
// arrive faster than it completes them (see Limiter).
func (l *Limiter) Overloaded() bool { return l.overloaded.Load() }

// Suspect reports whether the server is in its suspect phase (see
// Limiter): Wait holds what exceeds its cap, WaitHeld does not.
func (l *Limiter) Suspect() bool { return l.suspect.Load() }

// Latency returns the latency a new request can expect; zero before
// anything completed. While the server is overloaded or suspect (see
// Limiter), or requests ended lately after their callers left (a hang
// below: the successes' mean is from before it), it is (in flight + 1) x
// the time per completion over the last windows; otherwise the mean
// latency of the recent successes: the
// time per completion is the server's rate only while it is saturated,
// and over windows that were mostly idle it read 11 to 15 s for a server
// answering in 30 ms, the moment a batch job's 64 workers started (a
// user's trial). While requests are in flight and none completed over
// those windows (a stall, a hang below), the time per completion is at
// least the windows' length, and that is what it counts: read as zero,
// the gauge of it stayed at zero for the first second of a hang while
// the requests in flight rose from 61 to 285 (a user's trial).
func (l *Limiter) Latency() time.Duration {
	per, in := l.perDone.Load(), l.inflight.Load()
	switch mean := l.lastMean.Load(); {
	case per == 0 && in > 0:
		per = l.stalled.Load()
	case per > 0 && mean > 0 && !l.overloaded.Load() && !l.suspect.Load() && !l.lateLately.Load():
		return time.Duration(mean)
	}
	return time.Duration((in + 1) * per)
}

// Stats is a snapshot of a Limiter, for metrics.
type Stats struct {
	// Limit is Config.MaxInFlight (0: no cap).
	Limit    int
	InFlight int
	// Overloaded is Limiter.Overloaded.
	Overloaded bool
	// Latency is Limiter.Latency: what a new request can expect.
	Latency time.Duration
	// Base is the latency without a queue to which the target is added
	// (see Limiter): the mean latency of the recent successes outside an
	// overload, as followService and checkModel move it during one.
	Base time.Duration
	// Queue is the number of requests waiting in the queue (Wait).
	Queue int
	// RejectedOverload, RejectedDeadline, RejectedLimit and RejectedQueue
	// count the requests refused with ErrOverload, ErrDeadline, ErrLimit
	// and ErrQueueTimeout since New.
	RejectedOverload, RejectedDeadline, RejectedLimit, RejectedQueue int64
	// Abandoned counts the requests released Abandoned since New.
	Abandoned int64
}

// Stats returns a snapshot of l.
func (l *Limiter) Stats() Stats {
	return Stats{
		Limit:            l.Limit(),
		InFlight:         l.InFlight(),
		Overloaded:       l.Overloaded(),
		Latency:          l.Latency(),
		Base:             l.baseLatency(),
		Queue:            l.Queue(),
		RejectedOverload: l.rejected[reasonOverload].Load(),
		RejectedDeadline: l.rejected[reasonDeadline].Load(),
		RejectedLimit:    l.rejected[reasonLimit].Load(),
		RejectedQueue:    l.rejected[reasonQueue].Load(),
		Abandoned:        l.abandoned.Load(),
	}
}

// baseLatency returns the server's latency without a queue (Stats.Base).
func (l *Limiter) baseLatency() time.Duration {
	return time.Duration(l.threshold[ClassFirst].Load() - int64(l.cfg.Target))
}
