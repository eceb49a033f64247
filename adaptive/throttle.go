package adaptive

import (
	"errors"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

// ErrThrottled is returned by Allow for a request shed by the
// proportional rule, or a retry refused because the target is not
// healthy. Check it with errors.Is.
var ErrThrottled = errors.New("adaptive: throttled")

// ErrDown is returned by Allow while the target is down, for every
// request that is not a probe. It wraps ErrThrottled.
var ErrDown = &downError{}

type downError struct{}

func (*downError) Error() string        { return "adaptive: target down" }
func (*downError) Unwrap() error        { return ErrThrottled }
func (*downError) Is(target error) bool { return target == ErrThrottled }

// Outcome is what an attempt showed about the target, reported with
// Permit.Done.
type Outcome int

// The outcomes of an attempt.
const (
	// Accept: the target answered, with any code but an overload one.
	Accept Outcome = iota
	// Overload: the target refused (UNAVAILABLE) or did not answer
	// before a deadline.
	Overload
	// Ignored: the attempt says nothing about the target (the caller
	// cancelled, or a tier below refused on its own behalf). Values other
	// than Accept, Overload, Busy and Silence are treated as Ignored.
	Ignored
	// Busy: the target refused the attempt to protect itself (admission
	// control shed it): it is alive and serving what it can. A busy
	// answer counts as a request that was not accepted, but as a loss
	// that three accepts forget (unlike an overload failure, which the
	// window remembers for DownAfter after it): a target that serves part
	// of what it is sent and refuses the rest, cheaply and with pushback,
	// is sent everything, and only one that accepts nothing is shed. It
	// never counts towards a run of failures, and so never marks the
	// target down, and it ends a down state as an accept does. Busy is
	// not broken.
	Busy
	// Silence: the caller's deadline ran out before the target answered
	// the attempt. It is an Overload if the attempt waited longer than
	// nearly all of the target's last accepted attempts took (their 90th
	// percentile rounded up to a power of two, between once and twice
	// it; the last 256 or so accepts, however old, and none that took
	// longer than Window), the target answered nothing since the attempt
	// was allowed, and such silences have gone on for DownAfter (a hang:
	// nothing comes back), and is Ignored otherwise, and before the target
	// ever answered: how long it takes is not known yet (a user's trial:
	// 10 ms deadlines at a chain that answers in 3-8 ms, whose first
	// calls waited for the connections below, called the healthy target
	// down 160 ms after the start, in 2 of 4 runs). A deadline shorter
	// than the target takes to answer says nothing about it: a
	// caller whose deadlines are 3 ms at a target that answers in 10 ms
	// would otherwise mark it down for every other caller too quiet to
	// be answered meanwhile. (So a hang is not seen by callers whose
	// deadlines are shorter than the target's answers were: they fail
	// at their deadlines, as they did before it.) If the target
	// answered others meanwhile, the deadline was shorter than the
	// target's latency of the moment, as on a healthy chain at capacity
	// whose latency is the callers' deadline, which a client cannot shed
	// away (a caller at a fixed concurrency sends its next request the
	// moment it is refused). Silences that all end within
	// DownAfter of the first are one event, not evidence: many attempts
	// sent at once whose deadlines run out together, or a caller's
	// process that did not run for a moment (on a saturated machine its
	// deadline timers fire before it reads the answers waiting for it).
	Silence
)

// String returns "accept", "overload", "ignored", "busy" or "silence".
func (o Outcome) String() string {
	switch o {
	case Accept:
		return "accept"
	case Overload:
		return "overload"
	case Ignored:
		return "ignored"
	case Busy:
		return "busy"
	case Silence:
		return "silence"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// numBuckets is the number of time buckets of the window.
const numBuckets = 10

const (
	// healthyRun failures since the last accept at most leave a target
	// healthy (Healthy).
	healthyRun = 2
	// retryRun overload failures in a row, with no accept between them
	// and none for a tenth of DownAfter (all of DownAfter if they came
	// together), stop retries (failingRun): at 30 % random failures a
	// given failure ends such a run in less than 1 % of cases, at a dead
	// target at 1000 requests/s it takes about 5 ms.
	retryRun = 8
	// minRequests is the least number of requests in the window for the
	// proportional rule to shed (and so to stop retries): below it, one
	// failure of a quiet client would shed half of its next requests.
	// A quiet client's dead target is caught by the down rule instead. At
	// 30 % random failures and K = 3, ten requests shed only when seven
	// of them failed (p about 0.002).
	minRequests = 10
	// minFresh accepts since the last overload failure, DownAfter apart
	// from it, clear the window.
	minFresh = 3
	// minColdRun failures, DownAfter apart from the first, mark a target
	// that never accepted anything down: so that one call's three
	// attempts all go out, whatever their backoff.
	minColdRun = 3
	// downRun overload failures in a row, with no accept between them and
	// the connection ready, mark a target that has accepted before down,
	// once they have lasted DownAfter: at 30 % random failures about 5e-5
	// of attempts (0.7 x 0.3^8) start such a run, while at a dead target
	// at 1000 requests/s the DownAfter of silence is the longer wait. See
	// quiet.go.
	downRun = 8
)

type bucket struct {
	idx      int64 // elapsed / width of the time this bucket counts
	req, acc int64
	busy     int64 // of req, answered busy (kinds' windows: see kindFailing)
}

// latClasses is the number of latency classes of Throttle.lat: class c
// holds latencies of [2^(c-1), 2^c) x 1024 ns (class 0 those under 1 µs),
// the last one everything from about 1.1 s on.
const latClasses = 22

// latKeep is the weight an accepted attempt's latency keeps at each later
// one (see typical): the last 256 or so count.
const latKeep = 1 - 1.0/256

// latClass returns the latency class of d nanoseconds.
func latClass(d int64) int {
	return min(bits.Len64(uint64(max(d, 0))>>10), latClasses-1)
}

// Throttle protects one target. Create one with New; the zero value is
// not usable. It is safe for concurrent use.
//
// Call Allow before each attempt (retry true for a retry of the same
// call); if it returns no error, make the attempt and report what it
// showed with Done on the returned Permit. See the package documentation
// for the three rules it applies. Nothing happens in the background: no
// goroutines, no timers.
type Throttle struct {
	cfg   Config       // normalized
	since *clock.Since // the time since the throttle was made, never going back
	width int64        // nanoseconds per bucket
	rand  func() float64

	// word is gen<<1 | 1 while Allow may pass every attempt without a
	// look at the window: the target is up, not failing in a run, and the
	// shedding probability was zero at the last outcome. Written under mu.
	word atomic.Uint64
	_    [56]byte

	mu sync.Mutex
	// answers counts the answers (accepts and busy answers), written
	// under mu (next to it: every outcome writes that line anyway) and
	// read without: a Permit notes it, so that a Silence can tell
	// whether the target answered while its attempt waited.
	answers atomic.Uint64
	// Guarded by mu.
	// silent: silences came with no answer since silentAt (answers then),
	// the first of them at silentFrom; silentN of them, not yet counted
	// (see silences).
	silent     bool
	silentAt   uint64
	silentFrom int64
	silentN    int64
	buckets    [numBuckets]bucket
	kinds      [maxKinds]kindWindow // the kinds' own windows (see kindProbability)
	// lat: the accepted attempts by how long they took, each weighted by
	// latKeep to the power of the accepts after it, times latScale (the
	// next one's weight, 1 at first; see typical).
	lat        [latClasses]float64
	latScale   float64
	gen        uint64 // grows on every change between up and down
	down       bool
	accepted   bool  // any accept seen
	lastAccept int64 // elapsed at the last accept
	run        int64 // overload failures since the last accept
	runStart   int64 // elapsed at the first of them
	lastFail   int64 // elapsed at the last overload failure while up
	fresh      int64 // accepts since then
	credit     float64
	// floorRate: the probe credit a nanosecond adds while down, at
	// least (see allowDown); lastAsk: elapsed at the last request while
	// down, or at the down.
	floorRate float64
	lastAsk   int64
	probes    int // probes since the target was marked down
	// The kinds of request (see AllowFor) while down: of the last probe
	// allowed, and of the last that failed; otherKind: a request of
	// another kind than missKind asked since; skipped: a probe was
	// refused to one of missKind since (see preferOther).
	probeKind, missKind string
	otherKind, skipped  bool
	early               bool // down on a run of failures: probe early (quiet.go)
	nextProbe           int64
	p                   float64       // the last shedding probability computed
	broken              bool          // the connection was seen not ready, and not ready since
	back                chan struct{} // while down, if asked for: closed when up again
	// unconfirmed: up since its connection was ready again (a health
	// trial), or since an answer to an attempt allowed before the down (a
	// straggler), with no answer since (to an attempt of generation
	// confirmFrom or later): that up was not reported, nor will a down
	// from it be (see Connectivity, and done).
	unconfirmed bool
	confirmFrom uint64
	stats       Stats
}

// Stats are a Throttle's counters since it was created, and its state.
type Stats struct {
	// Down reports whether the target is down now.
	Down bool
	// Probability is the shedding probability as of the last outcome (or
	// the last Allow that looked at the window); 1 while the target is
	// down.
	Probability float64
	// Shed counts requests refused by the proportional rule,
	// RetriesRefused retries refused because the target was not healthy,
	// Refused requests refused while the target was down, and Probes the
	// attempts let through while it was down.
	Shed, RetriesRefused, Refused, Probes int64
	// Downs counts the times the target was marked down, as OnDown
	// reports them: not again after a revival by its connection alone
	// (see Connectivity).
	Downs int64
}

// New returns a throttle for a target that is up, or an error wrapping
// ErrInvalidConfig when a field of cfg is invalid.
func New(cfg Config) (*Throttle, error) {
	n, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	return newThrottle(n), nil
}

func newThrottle(cfg Config) *Throttle {
	t := &Throttle{cfg: cfg, rand: cfg.Rand, width: int64(cfg.Window / numBuckets), latScale: 1}
	var clk clock.Clock = clock.Real{}
	if cfg.Clock != nil {
		clk = cfg.Clock
	}
	t.since = clock.NewSince(clk)
	if t.rand == nil {
		t.rand = rand.Float64
	}
	t.word.Store(1)
	return t
}

// publish sets p and word from the state at el. Whatever looks at the
// window under the lock publishes what it saw: the window it forgets
// (see probability) is forgotten for Stats, ProbabilityFor and the next
// first attempt too. t.mu is held.
func (t *Throttle) publish(el int64) {
	t.p = 0
	if !t.down {
		t.p = t.probability(el)
	}
	w := t.gen << 1
	if !t.down && t.run < quietRunMin && t.p == 0 {
		// From quietRunMin failures in a row on, whether a retry passes
		// depends on the time from the last accept to the last failure
		// (quietRun): Allow must look.
		w |= 1
	}
	if t.word.Load() != w {
		// Unchanged, as mostly after a look or a failure, it is not
		// written: every first attempt reads it.
		t.word.Store(w)
	}
}

// Name returns the Config's Name.
func (t *Throttle) Name() string { return t.cfg.Name }

// elapsed returns the nanoseconds since the throttle was created, never
// less than before (see clock.Since).
func (t *Throttle) elapsed() int64 { return int64(t.since.Elapsed()) }

// draw returns a number from the random source, clamped to [0, 1).
func (t *Throttle) draw() float64 {
	u := t.rand()
	switch {
	case !(u >= 0): // also NaN
		return 0
	case u >= 1:
		return 0.9999999999
	}
	return u
}

// Permit is the right to make one attempt, returned by Allow. Report
// what the attempt showed with Done. The zero Permit's Done does nothing.
type Permit struct {
	t       *Throttle
	kind    string // of the request (see AllowFor)
	gen     uint64
	answers uint64 // t.answers when allowed
	at      int64  // t.elapsed() when allowed
	probe   bool
}

// Probe reports whether the Permit is for a probe of a down target.
func (p Permit) Probe() bool { return p.probe }

// Allow asks to make an attempt; retry is true for a retry of a call
// whose earlier attempt failed. It returns ErrDown while the target is
// down and this attempt is not a probe, ErrThrottled when the attempt is
// shed or a retry is refused, and otherwise a Permit whose Done must be
// called once with the outcome (an unreported Permit costs nothing but
// the information).
func (t *Throttle) Allow(retry bool) (Permit, error) { return t.AllowFor(retry, "") }

// AllowFor is Allow for a request of a kind: the method of a gRPC call,
// or whatever part of the target a request reaches ("" for none). The
// outcomes of a kind also count on their own, and the proportional rule
// sheds a kind no more than the target, and no more than its own
// outcomes say once it has ten in the window (up to eight kinds; see the
// package documentation, rule 1). While
// the target is down, a probe that failed for one kind is followed by
// a probe for another kind, if one asks before the next request of the
// failed kind that may probe does after it: a target that serves several
// services, one of which fails everything, is probed through the others
// too, and the first of them that answers ends the down state. Probed
// only by the first request to ask after each gap, a caller that always
// called the failing service first (an aggregator: the optional pricing,
// then inventory) kept the target down, and its healthy inventory
// refused, for as long as pricing failed (a user's trial: 40 of 40
// refused over 18 s).
func (t *Throttle) AllowFor(retry bool, kind string) (Permit, error) {
	if w := t.word.Load(); w&1 == 1 && !retry {
		// The common case, a first attempt to a healthy target: no lock,
		// one clock read. A retry looks at the window as it is now, as
		// RetryAllowedFor does (word is of the last outcome: accepts
		// that aged out of the window since leave it healthy), and at
		// its kind (see kindFailing).
		return Permit{t: t, kind: kind, gen: w >> 1, answers: t.answers.Load(), at: t.elapsed()}, nil
	}
	u := t.draw()
	el := t.elapsed()
	t.mu.Lock()
	if t.down {
		return t.allowDown(el, u, retry, false, false, kind)
	}
	t.publish(el)
	p := t.kindProbability(el, kind, t.p)
	if retry && (t.failingRun(el) || p > 0 || t.quietRun() || t.kindFailing(el, kind)) {
		t.stats.RetriesRefused++
		t.mu.Unlock()
		return Permit{}, ErrThrottled
	}
	if u < p {
		// A shed request does not count as a request: only what the
		// target was sent does, when its outcome comes (so that attempts
		// in flight do not count as refused by the target either). A
		// caller at a fixed concurrency (a load test, a worker pool) sends
		// again the moment it is refused; counted, its refusals would
		// drive the ratio to 1 and shed everything.
		t.stats.Shed++
		t.mu.Unlock()
		return Permit{}, ErrThrottled
	}
	gen := t.gen
	t.mu.Unlock()
	return Permit{t: t, kind: kind, gen: gen, answers: t.answers.Load(), at: el}, nil
}

// probability returns the shedding probability at el. t.mu is held.
func (t *Throttle) probability(el int64) float64 {
	req, acc := t.sum(el)
	if req < minRequests {
		return 0
	}
	p := max(0, (float64(req)-t.cfg.K*float64(acc))/float64(req+1))
	if p > 0 && t.fresh >= minFresh && el-t.lastFail >= int64(t.cfg.DownAfter) {
		// Every attempt for DownAfter was accepted: the loss the window
		// remembers is over. Forget it, so that the target gets its
		// traffic back now rather than as the buckets age.
		t.buckets = [numBuckets]bucket{}
		t.clearKinds(el)
		return 0
	}
	return p
}

// RetryAllowed reports whether a retry would pass the throttle's rules
// now: the target is up, not failing in a run, and not being shed. A
// caller asks before it spends a retry budget and waits a backoff for a
// retry that Allow(true) would refuse.
func (t *Throttle) RetryAllowed() bool { return t.RetryAllowedFor("") }

// RetryAllowedFor is RetryAllowed for a retry of a request of a kind
// (see AllowFor), which AllowFor(true, kind) would refuse.
func (t *Throttle) RetryAllowedFor(kind string) bool {
	el := t.elapsed()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.servedNow(el, kind) && !t.failingRun(el) && !t.quietRun()
}

// servedNow reports whether the target is up and a request of kind is
// neither shed nor of a kind that fails nearly everything, judging the
// window as it is at el (and publishing it: see publish). t.mu is held.
func (t *Throttle) servedNow(el int64, kind string) bool {
	if t.down {
		return false
	}
	t.publish(el)
	return t.kindProbability(el, kind, t.p) == 0 && !t.kindFailing(el, kind)
}

// Healthy reports whether the target is up, has accepted an attempt,
// has failed at most twice since its last accept, and is not being shed:
// a failure now is a random one, not overload (at 10 % random failures,
// a run of two comes to 1 % of requests, whose second retry would
// otherwise wait out a backoff that is the whole of the p99). A retry of such a failure
// needs no backoff (the interceptor sends it at once, as Finagle requeues
// a rejected request at once under its retry budget): waiting would only
// idle a caller that has a fixed number of requests in flight, while a
// retry budget still bounds the retries.
func (t *Throttle) Healthy() bool { return t.HealthyFor("") }

// HealthyFor is Healthy for a failure of a request of a kind (see
// AllowFor): the kind is not being shed, whatever the target's other
// kinds do.
func (t *Throttle) HealthyFor(kind string) bool {
	el := t.elapsed()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.servedNow(el, kind) && t.accepted && t.run <= healthyRun
}

// AllowTrial is Allow(false) for the first attempt of a call made for a
// trial: a request that the caller's own server, or a server above it in
// the chain, let in against its overload to see whether it can serve
// again (admission.Permit.Trial; the interceptor passes the mark down).
// While the target is down, such an attempt is a probe whenever the probe
// interval has passed, without the probe credit.
//
// A tier whose admission control refuses nearly everything lets in only
// its trials, a few a second, and the tiers below it receive only those;
// counted by ProbeRatio, they would gather the credit for a probe of a
// down dependency only after seconds, and a trial refused here ends
// nothing, so that the tiers and the target held down would keep each
// other shut after the target is back. Trials are rare by construction
// (admission lets in at most one per four mean latencies, and only while
// nothing is served), and ProbeInterval still spaces the probes.
func (t *Throttle) AllowTrial() (Permit, error) { return t.AllowTrialFor("") }

// AllowTrialFor is AllowTrial for a request of a kind (see AllowFor).
func (t *Throttle) AllowTrialFor(kind string) (Permit, error) {
	if w := t.word.Load(); w&1 == 1 {
		return t.AllowFor(false, kind) // up and healthy: no lock
	}
	u := t.draw()
	el := t.elapsed()
	t.mu.Lock()
	if !t.down {
		t.mu.Unlock()
		return t.AllowFor(false, kind)
	}
	return t.allowDown(el, u, false, true, false, kind)
}

// AllowAgain is AllowFor(false, kind) for a request refused because the
// target is down, asking again (a caller held for the target, when the
// next probe may go: see ProbeIn): it may become that probe, but brings
// no probe credit of its own a second time, and is not counted refused
// again. For a target that is up it is AllowFor.
func (t *Throttle) AllowAgain(kind string) (Permit, error) {
	u := t.draw()
	el := t.elapsed()
	t.mu.Lock()
	if !t.down {
		t.mu.Unlock()
		return t.AllowFor(false, kind)
	}
	return t.allowDown(el, u, false, false, true, kind)
}

// allowDown is AllowFor for a down target; trial waives the probe
// credit (see AllowTrial), again asks for a request that asked before
// (see AllowAgain). t.mu is held; it unlocks.
func (t *Throttle) allowDown(el int64, u float64, retry, trial, again bool, kind string) (Permit, error) {
	if retry {
		t.stats.RetriesRefused++
		t.mu.Unlock()
		return Permit{}, ErrDown
	}
	if !again {
		if kind != t.missKind {
			t.otherKind = true
		}
		add := t.cfg.ProbeRatio
		if gap := el - t.lastAsk; gap > 0 {
			add = max(add, float64(min(gap, int64(t.cfg.Window)))*t.floorRate)
			t.lastAsk = el
		}
		t.credit = min(t.credit+add, 1)
	}
	if (!trial && t.credit < t.probeNeed()-1e-9) || el < t.nextProbe || t.preferOther(kind) {
		if !again {
			t.stats.Refused++
		}
		t.mu.Unlock()
		return Permit{}, ErrDown
	}
	t.probeKind, t.otherKind, t.skipped = kind, false, false
	t.credit = 0
	t.probes++
	t.nextProbe = el + t.probeGap(u)
	t.stats.Probes++
	gen := t.gen
	t.mu.Unlock()
	return Permit{t: t, kind: kind, gen: gen, answers: t.answers.Load(), at: el, probe: true}, nil
}

// preferOther reports whether a request of kind, which may probe the
// down target, leaves the probe to a request of another kind: the last
// probe failed for kind, a request of another kind asked since, and
// none of kind was refused the probe so yet (see AllowFor). t.mu is
// held.
func (t *Throttle) preferOther(kind string) bool {
	if kind == "" || kind != t.missKind || !t.otherKind || t.skipped {
		return false
	}
	t.skipped = true
	return true
}

// probeGap is ProbeInterval spread over [0.5, 1.5) by u.
func (t *Throttle) probeGap(u float64) int64 {
	return int64(float64(t.cfg.ProbeInterval) * (0.5 + u))
}

// Done reports what the attempt showed. An Accept ends the down state;
// an Overload that comes after DownAfter without an accept starts it.
// Outcomes of attempts allowed before the last change between up and
// down count only as an Accept ending a down state (the target answered).
func (p Permit) Done(o Outcome) {
	if p.t == nil {
		return
	}
	if o == Silence && p.t.answers.Load() != p.answers {
		return // the target answered others meanwhile (see Silence)
	}
	if o != Accept && o != Overload && o != Busy && o != Silence {
		return
	}
	p.t.done(p.gen, p.at, o, p.probe, p.kind)
}

func (t *Throttle) done(gen uint64, at int64, o Outcome, probe bool, kind string) {
	var u float64
	if o == Overload || o == Silence {
		u = t.draw()
	}
	el := t.elapsed()
	t.mu.Lock()
	n, from := int64(1), el  // overload failures, the first at from
	answered := o != Silence // an answer, not a deadline that ran out
	if o == Silence {
		if !t.accepted || el-at < t.typical() {
			// The deadline ran out before the target would have
			// answered: no evidence (see Silence).
			t.mu.Unlock()
			return
		}
		if n, from = t.silences(el, kind); n == 0 {
			t.mu.Unlock()
			return
		}
		o = Overload
	}
	changed := false
	if o == Accept || o == Busy {
		t.answers.Add(1)
		if t.unconfirmed && !t.down && gen >= t.confirmFrom {
			// The first answer since a revival by the connection alone,
			// or the first to an attempt sent since a revival by a
			// straggler: now the target is reported back up.
			t.unconfirmed = false
			changed = true
		}
	}
	if t.back != nil && (o == Accept || o == Busy) {
		// An answer: the target serves (see Back).
		close(t.back)
		t.back = nil
	}
	switch o {
	case Busy:
		// Alive: no run of failures goes on through it, and a down
		// target is up again; but not accepted.
		t.run = 0
		t.broken = false
		if t.down {
			changed = t.revivedBy(gen, el)
			t.accepted, t.lastAccept = true, el
		} else if gen == t.gen {
			t.count(el, kind, 1, 0, 1)
		}
	case Accept:
		if d := el - at; d <= int64(t.cfg.Window) {
			// A longer one (a stream's first message, minutes after it
			// opened) says nothing of how long the target's calls take.
			t.noteLatency(d)
		}
		t.accepted, t.lastAccept, t.run = true, el, 0
		t.fresh++
		// An answer came through: the connection works, whatever was
		// last reported of it (a caller may report it only on failures).
		t.broken = false
		if t.down {
			changed = t.revivedBy(gen, el)
		} else if gen == t.gen {
			t.count(el, kind, 1, 1, 0)
		}
	case Overload:
		if t.down && probe && gen == t.gen {
			// A probe failed: the target is still down, and the callers
			// held for its answer (Back) learn it now rather than at the
			// end of their hold, whatever kind of request they are.
			// Held to its end, every request of an aggregator whose
			// optional dependency failed everything took the whole hold
			// (a user's trial: 18 ms became 240 ms, for as long as the
			// dependency failed); the whole holds served more of the
			// requests held across a target's return (the bufconn
			// scenarios: a partial loss 26 % served against 22 %,
			// retries off 20 %; an outage 8 % against 2 %, off 0 %). Not
			// a probe unanswered at its caller's deadline (a Silence),
			// which says what the target did when it went, maybe a
			// second before (a hang that ended meanwhile); a probe whose
			// own per-attempt timeout ran out is a failure (an Overload).
			// The next probe goes to another kind of request, if one
			// asks (see AllowFor).
			t.missKind = t.probeKind
			if t.back != nil && answered {
				close(t.back)
				t.back = nil
			}
		}
		if t.down || gen != t.gen {
			if !answered {
				t.clearSilences()
			}
			break
		}
		if !answered {
			t.countSilences(el, n)
		} else {
			t.count(el, kind, n, 0, 0)
		}
		if t.run == 0 {
			t.runStart = from
		}
		t.run += n
		t.lastFail, t.fresh = el, 0
		since := t.runStart
		if t.accepted {
			since = t.lastAccept
		}
		// A failure on a connection seen not ready needs no silence:
		// no attempt can be accepted until it is ready again, and its
		// coming back revives the target (Connectivity). Waiting
		// DownAfter would only fill the window with failures that shed
		// the traffic after that revival.
		if (el-since >= int64(t.cfg.DownAfter) || t.broken && t.accepted) && t.enoughEvidence() {
			t.down = true
			t.gen++
			t.credit, t.probes = 0, 0
			t.lastAsk, t.floorRate = el, t.creditFloor(el)
			t.probeKind, t.missKind, t.otherKind, t.skipped = "", "", false, false
			t.early = !t.broken
			t.nextProbe = el + t.probeGap(u)
			if t.unconfirmed {
				// Down again before any answer confirmed the revival:
				// reported as up, it was never reported back up.
				t.unconfirmed = false
			} else {
				t.stats.Downs++
				changed = true
			}
		}
	}
	down := t.down
	if o != Accept || changed || t.word.Load()&1 == 0 {
		// An accept on a healthy target changes nothing that word
		// shows: it only lowers p (by K-1) and ends no state.
		t.publish(el)
	}
	t.mu.Unlock()
	if changed && t.cfg.OnDown != nil {
		t.cfg.OnDown(t.cfg.Name, down)
	}
}

// silences notes a silence at el (an attempt whose deadline ran out with
// no answer from the target while it waited) and returns how many
// silences count as overload failures now, and when the first of them
// came. Silences since the last answer count once they have gone on for
// DownAfter (see Silence), and then all of them: a hang is caught
// DownAfter after its first deadline ran out (before, at the eighth
// silence), while silences that end together count for nothing. Each
// kind's are noted on their own too, so that each counts for its kind
// (see countSilences). t.mu is held.
func (t *Throttle) silences(el int64, kind string) (n, from int64) {
	if a := t.answers.Load(); !t.silent || t.silentAt != a {
		t.silent, t.silentAt, t.silentFrom, t.silentN = true, a, el, 0
		t.clearSilences()
	}
	t.silentN++
	if k := t.kindFor(kind, el, true); k != nil {
		k.silentN++
	}
	if el-t.silentFrom < int64(t.cfg.DownAfter) {
		return 0, 0
	}
	n, t.silentN = t.silentN, 0
	return n, t.silentFrom
}

// revivedBy ends the down state on an answer to an attempt of generation
// gen, and reports whether that is reported now. An answer to an attempt
// allowed before the down (not a probe) is reported once an attempt sent
// since is answered, and a down before that is not reported: while the
// last replica of several drains and no other is connected yet, its late
// answers revived the target and the next call, on a channel not ready,
// marked it down again, a pair of changes every 10 ms (a user's trial:
// 14-37 in a 250 ms gap of a rolling deploy). t.mu is held.
func (t *Throttle) revivedBy(gen uint64, el int64) bool {
	straggler := gen != t.gen
	t.setUp(el)
	if straggler {
		t.unconfirmed, t.confirmFrom = true, t.gen
		return false
	}
	return true
}

// setUp ends the down state at el with an empty window. t.mu is held.
func (t *Throttle) setUp(el int64) {
	t.silent = false
	t.down, t.broken = false, false
	t.gen++
	t.run = 0
	t.p = 0
	t.buckets = [numBuckets]bucket{}
	t.clearKinds(el)
	// The bucket array is indexed from the throttle's start; an empty
	// bucket with idx 0 is harmless wherever it lies.
}

// Revive ends the down state at once, for a signal that the target is
// back without a probe: its connection became ready again, or an answer
// from it carried its state. It does nothing to a target that is up.
func (t *Throttle) Revive() { t.revive(true) }

// revive is Revive; confirmed says whether the signal came from the
// target (an answer), which reports the target back up at once, or from
// its connection alone (see Connectivity), which waits for an answer.
func (t *Throttle) revive(confirmed bool) {
	el := t.elapsed()
	t.mu.Lock()
	changed := t.down
	// Up since a revival by its connection alone, and now confirmed by the
	// target: that up is reported now.
	report := confirmed && (changed || t.unconfirmed)
	if changed {
		t.setUp(el)
		t.accepted, t.lastAccept = true, el
		t.publish(el)
	}
	if changed || confirmed {
		t.unconfirmed, t.confirmFrom = !confirmed, 0
	}
	t.mu.Unlock()
	if report && t.cfg.OnDown != nil {
		t.cfg.OnDown(t.cfg.Name, false)
	}
}

// Connectivity reports the state of the connection to the target, for a
// caller that can see it (a gRPC channel's connectivity state): ready
// false while it is not connected, true when it is. A connection seen not
// ready (before or after the target went down) and then ready again while
// the target is down revives it (see Revive) without waiting for a probe:
// its process accepts connections again. A connection that stays ready
// says nothing (the target answers, with errors), and changes nothing.
//
// A revival by the connection alone is reported (OnDown, Stats.Downs)
// only once an answer confirms it, and a down before that is not
// reported again: a server that says NOT_SERVING over gRPC health
// checking and lets a trial in every 200 ms makes every client's channel
// ready at each trial, and each failed trial marked its clients' targets
// up and down again, a pair of changes every 200 ms through one outage
// (an operator's trial: 5 to 7 in 2.5 s).
func (t *Throttle) Connectivity(ready bool) {
	t.mu.Lock()
	switch {
	case !ready:
		t.broken = true
	case !t.down && t.run == 0:
		// Ready, and no failure since the last accept: the break is
		// over. During a run of failures the break stays remembered, so
		// that a target marked down later in the same run (its channel
		// came back, then failed again) is revived when its channel is
		// next seen ready, even if the client was too quiet to see each
		// change.
		t.broken = false
	case t.broken:
		t.mu.Unlock()
		t.revive(false)
		return
	}
	t.mu.Unlock()
}

// closedChan is what Back returns for a target that is up.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Back returns a channel that is closed when the target answers again
// after it was down (at once if it was not, and no Revive since left
// callers waiting for that answer: they share their channel): a probe or
// a straggler accepted, or answered busy; or when a probe failed
// (answered with an error, on a broken connection, or at its per-attempt
// timeout; not a probe unanswered at its caller's deadline, a Silence),
// and the target is still down (Down). A caller
// refused with ErrDown may wait on it, up to Config.Hold (Hold), and try
// again if the target is up: see Config.Hold. A probe's failure ends the
// wait so that a caller learns that the target is still down when the
// next probe does: a dependency that a caller can do without (one
// branch of a fan-out), killed or failing everything, cost every
// request the whole hold (users' trials: an aggregator's requests took
// 240-250 ms instead of 18-20 ms, for as long as it failed). Revive,
// and a connection ready again, end the down state but do not close it:
// a health trial makes every client's channel ready at once, and the
// callers held meanwhile would all go out on the trial, a herd that a
// server still failing cannot serve; they go when an answer says it
// serves, or when their hold ends.
func (t *Throttle) Back() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.back != nil {
		return t.back
	}
	if !t.down {
		return closedChan
	}
	if t.back == nil {
		t.back = make(chan struct{})
	}
	return t.back
}

// ProbeIn returns how long until the next request may probe the down
// target, if it has the credit (0: now, or the target is up). A caller
// held for the target (Back) may ask again then: held callers of a
// fixed number send nothing new while they wait, and without one of
// them no probe would go until their holds end.
func (t *Throttle) ProbeIn() time.Duration {
	el := t.elapsed()
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.down {
		return 0
	}
	return time.Duration(max(t.nextProbe-el, 0))
}

// Hold returns Config.Hold, normalized (0: no hold).
func (t *Throttle) Hold() time.Duration { return t.cfg.Hold }

// Down reports whether the target is down.
func (t *Throttle) Down() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.down
}

// ProbabilityFor returns the shedding probability of a request of a
// kind (see AllowFor) as of the last outcome: 1 while the target is
// down, else the target's probability (Stats.Probability), lowered to
// the kind's own where that is lower (the package documentation, rule
// 1). It is what a request of the kind that AllowFor shed met.
func (t *Throttle) ProbabilityFor(kind string) float64 {
	el := t.elapsed()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.down {
		return 1
	}
	return t.kindProbability(el, kind, t.p)
}

// Stats returns the throttle's counters and state.
func (t *Throttle) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.stats
	s.Down, s.Probability = t.down, t.p
	if t.down {
		s.Probability = 1
	}
	return s
}

// bucket returns the bucket for el, emptied if it held an older time.
// t.mu is held.
func (t *Throttle) bucket(el int64) *bucket { return bucketAt(&t.buckets, el, t.width) }

// bucketAt returns the bucket of bs for el, buckets width wide, emptied
// if it held an older time. One that holds a newer time (an outcome whose
// caller read the clock a window or more before it got the lock, a
// process that did not run for a moment) is kept, and the outcome counts
// in it: emptied, it lost the newer outcomes for one that is out of the
// window anyway.
func bucketAt(bs *[numBuckets]bucket, el, width int64) *bucket {
	idx := el / width
	b := &bs[idx%numBuckets]
	if b.idx < idx {
		*b = bucket{idx: idx}
	}
	return b
}

// noteLatency notes that an accepted attempt took d. t.mu is held.
func (t *Throttle) noteLatency(d int64) {
	t.lat[latClass(d)] += t.latScale
	// The next weighs 1/latKeep as much as this one: the same as this
	// one's weight times latKeep, without a pass over the classes.
	if t.latScale /= latKeep; t.latScale > 1e100 {
		for c := range t.lat {
			t.lat[c] /= t.latScale
		}
		t.latScale = 1
	}
}

// typical returns the least wait whose silence says something about the
// target (see Silence): the upper bound of the latency class of the 90th
// percentile of the last accepted attempts (the last 256 or so, however
// old), or 0 before any. The last accepts, not the last window's: when
// the target hangs, the only ones to come are the slow stragglers that
// were in flight, which would soon be all of a window. A percentile, not
// the slowest: one slow answer (a slow method's, or a watch's first
// message) must not hide a hang; and not the median: a caller with short
// deadlines whose calls are answered just in time now and then (3 ms at a
// target that answers its other callers in 10 ms) would set a bar below
// its own waits. t.mu is held.
func (t *Throttle) typical() int64 {
	total := 0.0
	for _, w := range t.lat {
		total += w
	}
	if total == 0 {
		return 0
	}
	seen := 0.0
	for c, w := range t.lat {
		if seen += w; seen >= 0.9*total {
			if c == 0 {
				return 0 // under a microsecond: no wait is shorter
			}
			return 1 << (c + 10)
		}
	}
	return 0
}

// sum returns the requests and accepts in the window ending at el. t.mu
// is held.
func (t *Throttle) sum(el int64) (req, acc int64) {
	w := sumOf(&t.buckets, el, t.width)
	return w.req, w.acc
}

// sumOf returns the counts of bs in the window ending at el (idx: none).
func sumOf(bs *[numBuckets]bucket, el, width int64) (sum bucket) {
	idx := el / width
	for i := range bs {
		b := &bs[i]
		if b.idx > idx-numBuckets && b.idx <= idx {
			sum.req += b.req
			sum.acc += b.acc
			sum.busy += b.busy
		}
	}
	return sum
}
