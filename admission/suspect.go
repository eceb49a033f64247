package admission

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// The suspect phase: arrivals exceed completions, and the server cannot
// yet tell real overload from a closed loop that is still ramping up.
//
// A load test that starts 512 callers at once over TCP, on two busy
// cores, takes tens of milliseconds to get them all in flight: for that
// long arrivals exceed completions (which lag by one latency), exactly as
// at the start of an open-loop overload. Refusing then would turn the
// ramp into refusals that its callers send again at once. So a suspect
// server refuses nothing: requests beyond the concurrency it had when it
// became suspect, or what its throughput needs if more (twice the
// completion rate times its latency without a queue, recomputed every
// window), wait in the limiter, newest first, and each completion admits
// one. A closed loop is then
// calm within a window or two (its arrivals follow its completions), and
// everyone waiting is admitted. An open loop stays above its completions:
// after suspectWindows windows in which its completions did not grow, or
// twice the latency that the requests in flight when it became suspect
// expect if longer (recomputed every window as the time per completion
// settles; 60 windows in all at most), or as soon as thousands wait, the
// server is overloaded, and the waiters are refused (they waited while
// newer requests went first: they are the overload), unless the new
// arrivals, refused, come back at once (verdict: a closed loop still
// ramping up, whose waiters then wait on, oldest first while the oldest
// can still be served in time). Serving the newest
// first keeps the latency of what is served short while the server is
// suspect; the handler's own queue holds no more than it did at the
// start, or than the cap grew to while the server showed room for more
// (roomFor).
const (
	// suspectWindows is long enough for a ramp of a few hundred callers
	// on a busy machine (ghz starts 512 in about 60 ms), and its calm:
	// the cost of waiting is only that the requests refused at the end
	// waited that long first, and the goroutines that wait.
	suspectWindows = 30
	// maxSuspectQueue waiters (or suspectPerSlot per slot of the cap, if
	// more) make a suspect server overloaded at once: no closed loop of
	// callers waits in such numbers behind so few slots, and an open loop
	// at 8 times a server's capacity fills it in tens of milliseconds.
	// suspectPerSlot times the cap in flight also bounds what WaitHeld
	// admits beyond the cap.
	maxSuspectQueue = 4096
	suspectPerSlot  = 8
	// minSuspectCap is the least concurrency a suspect server keeps.
	minSuspectCap = 4
	// suspectMaxWindows bounds the wait for a server whose expected
	// latency is long (and the estimate when completions lag the
	// arrivals most, at the start), and for one whose completions still
	// grow.
	suspectMaxWindows = 60
	// stillGrowing windows: a phase whose cap grew in two of its last
	// stillGrowing+1 windows, while its oldest waiter can still be served
	// in time, does not run out yet (it may still at suspectMaxWindows).
	stillGrowing = 8
)

// suspectQueue holds the requests waiting while the server is suspect,
// newest last.
type suspectQueue struct {
	mu      sync.Mutex
	waiters []*suspectWaiter
	// fifo: the oldest waiter goes first (the waiters are a closed
	// loop's, see verdict); else the newest.
	fifo bool
}

// live returns how many waiters still wait: not those whose wait ended
// out of turn (their caller left, or admitWaiter let them in: gone),
// which stay in the stack until dispatch or the phase's end drops them.
// Counted as waiting, the entries of callers that left made a closed
// loop whose callers leave at their deadline and send again look like
// thousands waiting, and the server overloaded (a review's simulation:
// 2 048 callers with deadlines under their latency). heldFlat counts
// them: they arrived and were not served. q.mu is held.
func (q *suspectQueue) live() int64 {
	n, _ := q.liveBudget()
	return n
}

// liveBudget is live, and the least budget of the waiters still waiting
// (0 if none of them has a deadline). q.mu is held.
func (q *suspectQueue) liveBudget() (n, budget int64) {
	for _, w := range q.waiters {
		if w.gone {
			continue
		}
		n++
		if w.budget > 0 && (budget == 0 || w.budget < budget) {
			budget = w.budget
		}
	}
	return n, budget
}

type suspectWaiter struct {
	ready chan struct{}
	// Guarded by suspectQueue.mu.
	admitted bool  // given a slot (counted in inflight); else: decide again
	refused  bool  // released as an overload's: refused
	closed   bool  // ready was closed
	gone     bool  // its caller left
	held     bool  // admitted under the cap once it grew on the work's evidence (see Permit.Held)
	budget   int64 // nanoseconds its caller's deadline left when it began to wait; 0: none (set before it is shared)
	since    int64 // when it began to wait (set before it is shared)
}

// becomeSuspect starts the suspect phase at the end of window win, with
// per nanoseconds per completion. l.mu is held.
func (l *Limiter) becomeSuspect(win window, per int64) {
	// What its throughput needs (Little's law): the completion rate
	// times the latency without a queue, doubled; the requests in flight
	// beyond that are queued in the handler, and adding more would only
	// lengthen that queue.
	// At least what is in flight: the callers of a ramp are mostly in
	// already, and holding them would only move their wait here, where
	// a deadline can end it.
	// Not the requests held above in flight: the cap is for the
	// server's own (takeUnheld).
	l.suspectCap.Store(max(l.throughputNeed(per), win.inflight-l.heldIn.Load()))
	l.suspectFor, l.suspectAll, l.suspectIn = 0, 0, win.inflight
	l.grewAt = [2]int64{-1, -1}
	l.suspectMax = l.suspectLength(per)
	l.calmRun = 0
	l.suspectFrom.Store(l.now())
	c := l.counters()
	l.suspDone, l.suspOffered = c.done, c.arrived+c.refused
	l.suspSum.Store(0)
	l.suspN.Store(0)
	l.roomSeen.Store(false)
	l.grew.Store(nil)
	l.fastSeen.Store(false)
	l.answerTried = false
	l.calmAfter = calmWindows
	l.suspect.Store(true)
}

// startAnswerProbe starts the answer probe of a suspect phase that ran
// out within closedMemory windows of a closed loop found (a verdict, or
// an answer probe), or with no deadline of a second or less among its
// waiting callers: the answers to the requests it serves are held for
// answerHold (HoldAnswer), and the offered arrivals of the second half
// compared with those before, as an overload's probe does with its
// refusals; not where fewer than probeArrivals are expected in that
// half. A closed loop's callers send again only when answered: their
// arrivals fall to what is new (a ramp's next callers), and the server
// is suspect again, with no refusal (endAnswerProbe). An open loop's go
// on: the phase ends in an overload at its next window, as it would have
// without the probe, a probe's length later (sooner, once the second
// half has seen the arrivals that make a fall impossible: surelyOpen).
// It reports whether the probe started: not with too few arrivals to
// compare, nor where the callers waiting could not be served within
// their deadlines. l.mu is held.
//
// Without it, every suspect phase that a load test's ramp outlasted (ghz
// adding 8 callers every 25 ms up to 512 or 1 024) became an overload,
// whose verdict refused its callers until their spin showed a closed
// loop: a pool of 4 x 5 ms meeting 512 callers over 1.6 s, five
// overloads and 335 refusals; over TCP 379-384 refusals, 748-767 at
// 1 024 callers.
func (l *Limiter) startAnswerProbe() bool {
	const half = answerHold / 2
	rate := l.offeredRate(rateWindows)
	if rate*float64(half) < probeArrivals {
		return false // too few arrivals to tell by in half the hold: a verdict tells
	}
	// Nor where what the server holds would not be served within the
	// least of the waiting callers' deadlines (Little's law, as in
	// heldFlat): those callers gain nothing by waiting on, and the
	// verdict's refusals send them again sooner, with a deadline anew
	// (the review grid's ramps whose 100 ms deadlines are shorter than
	// their queue: 1.8 % fewer served in time with the probe there).
	l.sq.mu.Lock()
	live, budget := l.sq.liveBudget()
	l.sq.mu.Unlock()
	if per := l.perDone.Load(); budget > 0 && (per == 0 || (l.inflight.Load()+live)*per > budget) {
		return false
	}
	// Before any closed loop is found, only where none of the waiting
	// callers is in a hurry: none set a deadline, or none of them a
	// deadline of a second or less (patientBudget). They would rather
	// wait than fail, and a load test's ramp is told without a refusal
	// (ghz's --timeout 0, and its default of 20 s). An open loop of
	// such callers pays the hold once, at its overload's start
	// (TestPatientOpenLoopHeldOnce); one whose callers give a second
	// or less holds nothing, its verdict refuses as before
	// (TestOpenLoopOverload: p99 within the target in every slice).
	// And only with callers waiting: the answers held are those of
	// requests admitted alongside them.
	if !l.closedLately() && (budget > 0 && budget <= int64(patientBudget) || live == 0) {
		return false
	}
	l.answerProbe.begin(l, rate, half, l.endAnswerProbe)
	return true
}

// endAnswerProbe ends the answer probe that holds h: the answers go out,
// and a closed loop (its arrivals fell below half their rate) makes the
// server suspect again, its waiters served oldest first, as a verdict
// that found one does. Its timer calls it; l.mu is not held.
func (l *Limiter) endAnswerProbe(h *chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fell, ok := l.answerProbe.end(l, h)
	if !ok {
		return
	}
	if !fell {
		l.answerTried = true
		return
	}
	l.suspectAgain()
	// The probe's windows, whose arrivals fell by its hold, are no
	// calm: the tests of calm begin past them.
	l.calmAfter = calmSpan + 1
	l.dispatchSuspect()
}

// suspectAgain makes the server suspect again after a closed loop of
// callers was found (a verdict, an answer probe): its waiters wait on,
// oldest first. The caller dispatches them. l.mu is held.
func (l *Limiter) suspectAgain() {
	l.closedAt = l.now()
	l.sq.mu.Lock()
	l.sq.fifo = true
	l.sq.mu.Unlock()
	l.becomeSuspect(window{inflight: l.inflight.Load()}, l.perDone.Load())
}

// closedLately reports whether a verdict or an answer probe found a
// closed loop within the last closedMemory windows. l.mu is held.
func (l *Limiter) closedLately() bool {
	return l.closedAt > 0 && l.now()-l.closedAt <= closedMemory*int64(l.cfg.Window)
}

// HoldAnswer waits, while the limiter holds the answers of the requests
// it admitted to tell a closed loop of callers from an open one, until
// that ends or ctx is done; else it returns at once. Call it after
// Permit.Release, before answering: the interceptor does. A hold lasts
// 80 ms at most, once per suspect phase that runs out within 100
// windows (a second by default) of a closed loop of callers found (a
// load test still ramping its callers up), or while none of its
// waiting callers set a deadline of a second or less; a caller of
// Release that does not call it only makes the limiter take such a
// closed loop for an open one, and refuse what a verdict needs to tell
// them apart, as before there was a hold.
func (l *Limiter) HoldAnswer(ctx context.Context) { l.answerProbe.await(ctx) }

// suspectLength returns how many windows without growth the server may
// stay suspect, with per nanoseconds per completion: suspectWindows, or
// twice the latency the requests in flight when it became suspect
// expect if longer, up to suspectMaxWindows. l.mu is held.
func (l *Limiter) suspectLength(per int64) int64 {
	expected := (l.suspectIn + 1) * per
	return min(max(suspectWindows, 2*expected/int64(l.cfg.Window)), suspectMaxWindows)
}

// heldFlat records what the server holds at the end of a suspect window
// (in flight and waiting) and reports whether it grew by no more than
// growthMargin over the last span windows (calmSpanNow; what it held
// before the phase counts too: recordHeld). A closed loop holds its
// callers, no more: once its ramp is over, what it holds stays put,
// however bursty its completions, while an open loop's grows by its
// excess every window.
//
// The entries of waiters whose callers left count too (they arrived and
// were not served: an open loop's excess that leaves at its deadline
// holds a flat number waiting), unless what the server holds would be
// served within the least of the waiting callers' deadlines if it let
// them all in (Little's law, at the time per completion): then the
// callers left because they waited here, not because the server could
// not serve them, and counted, they kept a closed loop of callers
// suspect until it was overloaded. A review's simulation: 512 callers
// ramping over 400 ms on 8 workers of 1 ms, 128 ms deadlines, where the
// server alone serves everyone in 64 ms: the suspect phase's cap held
// its latency above the overload rule's threshold, so that no waiter was
// let in before its deadline, the waiters left, and the server refused
// 1.1 million requests and served 2 % in time. l.mu is held.
func (l *Limiter) heldFlat(inflight int64, span int) bool {
	l.sq.mu.Lock()
	live, budget := l.sq.liveBudget()
	held := inflight + live
	if per := l.perDone.Load(); budget == 0 || per == 0 || held*per > budget {
		held += int64(len(l.sq.waiters)) - live
	}
	l.sq.mu.Unlock()
	l.recordHeld(held)
	return l.histN > span && held <= l.held[calmSpan-span]+growthMargin
}

// recordHeld records what the server holds at the end of a window: in
// flight and waiting while it is suspect (heldFlat), in flight
// otherwise. Every window's end records once, as it records the window
// (roll), so that the last min(histN, calmSpan+1) are there. l.mu is
// held.
func (l *Limiter) recordHeld(held int64) {
	copy(l.held[:], l.held[1:])
	l.held[calmSpan] = held
}

// calmSpanNow returns how many of the last windows the tests of calm
// span: calmWindows at least, and as many more as hold calmEvents
// arrivals and completions, up to calmSpan.
//
// A window ends with minEvents events. A pool whose hold spreads (16
// workers of 50 ms on average, exponential) at twice its capacity
// completes 3 or 4 requests a window, and what it holds grows by 2 or 3
// a window, give or take as much (Poisson): over two windows it looks
// flat (within growthMargin) about one window in six by that count, and
// two such windows in a row came within most suspect phases. Each
// calm end let the waiters in, the next phase took all of them in
// flight as its cap, and the handler's queue grew to the callers'
// deadlines without an overload ever being declared (busy's
// overload-spread over TCP: one run in five collapsed so, 0.01-0.08x of
// capacity in its last second; TestSpreadOverloadIsDeclared: 7 of 16
// seeds). Over 64 events that open loop's excess (a third of them: 21)
// is two and a half of its spreads above the margin. A closed loop's is
// nothing over any span, and a healthy server's, with no excess to
// show, should look flat over 64 events about as often as over 16 (the
// review grid's healthy closed loops: identical). l.mu is held.
func (l *Limiter) calmSpanNow() int {
	var events int64
	for i := range min(calmSpan, l.histN) {
		w := l.recent(i)
		events += w.arrived + w.refused + w.done
		if i+1 >= calmWindows && events >= calmEvents {
			return i + 1
		}
	}
	return calmSpan
}

// servedLately reports whether the server completed a request (served
// or failed, not abandoned) in the last rateWindows windows. l.mu is
// held.
func (l *Limiter) servedLately() bool {
	for i := range min(rateWindows, l.histN) {
		if w := l.recent(i); w.done > w.abandoned {
			return true
		}
	}
	return false
}

// failingLately reports whether the server's completions of the last
// rateWindows windows were failures, more of them than requests its
// callers left, and not one a success: a server that fails, rather than
// one whose callers give up on it. A gateway whose calls below time out
// sees most of its requests end Abandoned, and a few fail fast (a
// throttle below refused them); read as failing, it let everything it
// held in at once, into the queue its callers had given up on. l.mu is
// held.
func (l *Limiter) failingLately() bool {
	var failed, abandoned int64
	for i := range min(rateWindows, l.histN) {
		w := l.recent(i)
		if w.least > 0 {
			return false
		}
		failed += w.done - w.abandoned
		abandoned += w.abandoned
	}
	return failed > abandoned
}

// throughputNeed is the concurrency the server's throughput needs, with
// per nanoseconds per completion: twice the completion rate times the
// latency without a queue (the base), at least minSuspectCap. Not the recent
// least latency: where the handler's own queue never empties, it includes
// a wait, and a cap that followed it would let that queue grow. l.mu is
// held.
func (l *Limiter) throughputNeed(per int64) int64 {
	if per <= 0 {
		return minSuspectCap // no completion lately: no rate to need
	}
	least := l.base
	for i := range min(rateWindows, l.histN) {
		if w := l.recent(i); least == 0 && w.least > 0 {
			least = w.least
		}
	}
	return max(int64(2*float64(least)/float64(per)), minSuspectCap)
}

// roomFor returns the cap a suspect server may grow to at the end of
// win, 0 for none: twice the cap, up to twice what its arrivals need at
// the latency of the requests it admitted and served since it became
// suspect (Little's law), if the cap is full and holds requests back,
// and one of those requests was served within the base since the cap
// last grew, or the work shows room for more (slowerWork; four times
// the cap once the requests let in by such a growth are in). A server
// that queues makes every request wait once more are in flight than it
// has workers, and then none is served that fast; one that waits (on a
// dependency, a database), whose requests take what they take however
// many are in flight, keeps serving its fast requests fast, and its cap
// grows to what its arrivals need, not to what the base (the mean of
// what it served before) says they need: a server of fast requests (5 ms) given
// slow ones as well (100-300 ms, 128 a second: 26 in flight) was held at
// the 5 to 10 it had when it became suspect, its completions fell behind
// its arrivals for the cap's sake, and it refused 42-84 % of both kinds
// (a user's trial). But few of its fast requests get a slot among the
// slow ones, and half of those take longer than the base (their mean):
// at 192 slow requests a second the cap still grew too late in 40 of the
// review grid's 200 seeds, which refused up to 72 % of their requests.
// So the cap also grows where the work itself has become slower than the
// base says (slowerWork), by four times once the requests that growth
// let in are in. The need bounds the growth where the requests that are not
// served fast never end (half of them hang below the server:
// TestHangAdmitsNoBacklog).
//
// A known limit (a review's simulation): a server whose slow requests
// wait on a dependency that queues (a database of 8 connections at 1.75
// times what they can do), next to fast ones (30 % cache hits of 1 ms),
// grows its cap on the fast ones while the queue lengthens, ends the
// phase calm when its callers' deadlines balance what it holds, and
// starts the next one at what it then holds: 178-297 in flight at most
// against 21-83, p99 of what it served 597-764 ms against 64-218 ms (1 s
// deadlines; as many served and refused). Two guards on the slow
// requests' latency were tried and not kept: they left it as it was and
// held the cap of the healthy mix in 6 and 10 of 100 seeds.
//
// A window that ends at a completion (Release rolls it before it lets
// the next waiter in) sees one below the cap in flight while that waiter
// is about to take the slot, so that a server whose windows end mostly
// at completions never looked full: a tier whose arrivals come one at a
// time from the tier above (busy's mix over TCP: payment suspect at a
// cap of 4, 3 in flight and 3 waiting at the end of every window for 1.2
// s, its slots completing one per 35-58 ms against a base of 5.6 ms,
// while every request of the chain waited there for a slow one to end;
// the gateway above never saw a request served fast, and its phase ran
// out into an overload that served 34 % of a healthy load). One below
// the cap with a waiter now counts as full for the work's evidence
// (slowerWork), which a pool that queues does not show; not for a
// request served within the base, which pools whose latency spreads
// serve by chance: read as full for that too, their caps grew into their
// queues (TestColdOverloadVariedService: p99 1.4 s in 2 of its 16 runs;
// TestSpreadOverloadIsDeclared, one seed: 0.65x of capacity in time
// against 0.75x).
// l.mu is held.
func (l *Limiter) roomFor(win window) int64 {
	limit := l.suspectCap.Load()
	n := l.suspN.Load()
	own := win.inflight - l.heldIn.Load() // the server's own (takeUnheld)
	if own < limit-1 || n == 0 {
		return 0 // not full (one below it with a waiter: see above)
	}
	l.sq.mu.Lock()
	held := l.sq.live() > 0
	l.sq.mu.Unlock()
	if !held {
		return 0
	}
	seen := false
	if own >= limit {
		seen = l.roomSeen.Swap(false)
	}
	if !seen && !l.slowerWork() {
		return 0
	}
	rate := l.offeredRate(rateWindows)
	if rate == 0 {
		return 0
	}
	mean := l.suspSum.Load() / n
	need := int64(2 * rate * float64(mean))
	step := int64(2)
	if !seen && l.grew.Load() != nil {
		step = 4 // after a growth on the work's evidence whose requests are in
	}
	room := min(step*limit, need)
	if !seen && room > limit {
		// The next growth on the work's evidence waits for the latency
		// of what this one lets in (slowerWork).
		l.grew.Store(&growth{at: l.now(), limit: limit})
	}
	return room
}

// slowerWork reports whether the suspect cap, full and holding requests
// back, may grow on what the work shows where no request was served
// within the base since roomFor last looked.
//
// First, where the server completes fewer requests than half of what
// one slot would at the base (the time per completion above slowerPer
// base latencies), while one of the requests admitted in the phase was
// served within twice the base. A pool that queues completes one per
// base or faster, as many at a time as it has workers, whatever it
// holds; a pool whose work became slower (a query 8 times slower)
// completes more slowly, but then every request waits in its queue, and
// none is served that fast. A server that still serves some requests
// fast while its slots complete so slowly holds requests that take far
// longer than the base: slow requests next to fast ones (a report, a
// batch, next to cache hits). The cap grows once, to twice.
//
// Half, not a quarter (as it was): with a cap of 6 full of requests of
// 100-300 ms (about 150 ms on average, the fast ones among them), a
// slot completes one per 25 ms, and a quarter of one slot's rate at a
// base of 7 ms (a gateway over TCP, whose fast requests cross two more
// tiers) is one per 28 ms: the evidence came and went with the mix's
// draw, the cap grew too late in about one run of seven of busy's mix,
// and the gateway's phase ran out into an overload that served 32-54 %
// of a healthy load (5 of 37 runs; none of 40 at half, over the last
// windows alone; 3 of about 120 with the phase's time as well, below,
// and the rest of this change). The simulator's
// mix with fast requests of 5.5-8.5 ms: 5 seeds of 100 refusing at 192
// slow requests a second, 1 at half (TestSlowerMixNeverRefused). The
// fast request is what keeps a pool that queues out (it serves none
// that fast), with the time per completion over the whole phase (since
// it began, slowerPhaseDone completions at least) as well as over the last
// windows: a pool of one worker whose service times spread (10 ms,
// exponential or lognormal) completes slowly for a few windows by
// chance, often enough to read as slower at half (3 of 32 seeds at 8
// times its capacity marked Permit.Held, p99 up to twice as long, in a
// review's sweep; as many where a cold start's base is too short), and
// not over its phase (none of those at 8 times, nor of a cold pool of 4
// workers; 1 seed of 3 of a cold pool of one). The review grid at half is the
// same but for a few of its open loops (0.5 % of their refusals after
// the overload, one p99 worse by half) and its mix (the same 452
// refused, median p99 669 -> 653 ms).
//
// Then, only once the requests admitted since it last grew on this
// evidence are in (as many as twice the cap before it, grewSamples at
// least; served, or left by their callers): the growth's effect takes
// that long to show, since the first of them wait behind the old cap
// only. Grown on the time per completion alone, the cap let a pool
// that became slower fill its queue (TestSlowerPoolKeepsItsCap); grown
// on and on, a mix whose slow requests wait on a database's queue
// (TestSlowMixOverAQueueGrowsNoFurther). The wait holds both: the
// phase runs out, or the need bounds the cap, first. (A comparison of
// those requests' mean latency with the phase's before the growth, at
// most 1.5 times, refused no growth in any case measured, and was
// dropped: the review grid and the second review's slow family are
// byte-identical without it, as a helper's sweep had found.) A pool of
// 8 connections to a database at 1.75 times what they can do, next to
// cache hits (roomFor's known limit),
// completes faster than its base: unchanged; with 4 or 8 connections at
// 1.5 or 3 times, the cap grows into their queue: more served in time
// (4 at 3x: 2 229 of 4 139 against 1 670 of 4 384), but p99 0.4-1.1 s
// longer (a review's simulation). l.mu is held.
func (l *Limiter) slowerWork() bool {
	g := l.grew.Load()
	if g == nil {
		per := l.perDone.Load()
		if per <= 0 || l.base <= 0 || per <= slowerPer*l.base || !l.fastSeen.Load() {
			return false
		}
		// And over the whole phase, not the last windows' few
		// completions alone (see above).
		done := l.counters().done - l.suspDone
		return done >= slowerPhaseDone && (l.now()-l.suspectFrom.Load())/done > slowerPer*l.base
	}
	return g.n.Load() >= max(grewSamples, 2*g.limit)
}

// growth is a growth of the suspect cap on the work's evidence
// (slowerWork): when (nanoseconds since origin), the cap before it, and
// how many of the requests admitted since are in (served, or left by
// their callers). A new growth is a new value, so that a request
// released as one begins adds to the one it belongs to, never to the
// next.
type growth struct {
	at, limit int64
	n         atomic.Int64
}

// slowerPer, slowerPhaseDone and grewSamples: see slowerWork.
const (
	slowerPer       = 2
	slowerPhaseDone = 3
	grewSamples     = 4
)

// whileSuspect is the window's end while the server is suspect: calm
// ends it, a long enough excess of arrivals makes the server overloaded.
// l.mu is held.
func (l *Limiter) whileSuspect(win window) {
	// The cap follows what the throughput needs as the estimate settles
	// (at the start completions lag, and the time per completion reads
	// long), and so does the length of the wait (read at the start, it
	// was 60 windows for a gateway at 8x, long enough to let the oldest
	// waiters in at half their deadline).
	growing := false
	if room := l.roomFor(win); room > l.suspectCap.Load() {
		l.suspectCap.Store(room)
		growing = true
	}
	if per := l.perDone.Load(); per > 0 {
		if need := l.throughputNeed(per); need > l.suspectCap.Load() {
			l.suspectCap.Store(need)
			growing = true
		}
		l.suspectMax = l.suspectLength(per)
		// Completions whose callers had left after they held their slot
		// for a service time: those slots served no one, and the server
		// holds more than it can serve in time. The cap gives them up,
		// down to what the throughput needs (not below: !growing). A
		// caller that cancels at once (a hedge that lost) wasted no slot.
		if win.wasted > 0 && !growing {
			l.suspectCap.Store(max(l.suspectCap.Load()-win.wasted, l.throughputNeed(per)))
		}
	}
	// Calm: what it holds stopped growing, or its arrivals did not exceed
	// its completions over the last rateWindows windows together (both
	// over calmEvents events at least: calmSpanNow; and both only from
	// the phase's calmWindows-th window on). Not
	// per window: a saturated server on two cores completes in bursts
	// (hundreds in one window, none in the next), and a closed loop's
	// arrivals follow them a window later; per window, it would look
	// calm only by chance, and its oldest waiters would wait the whole
	// time.
	// And only while it serves: a server whose requests end at their
	// callers' deadlines holds as many as arrive, calm by both counts,
	// and would send what it holds into the hang.
	span := l.calmSpanNow()
	flat := l.heldFlat(win.inflight, span)
	balanced := l.calmOver(false, max(span, rateWindows))
	if l.suspectAll >= l.calmAfter && !l.answerProbe.on && (flat || balanced) && l.servedLately() {
		l.calmRun++
	} else {
		l.calmRun = 0
	}
	// Windows whose completions all failed: the server is failing, not
	// busy (see whileNot and failingLately), and its waiters go in at
	// once. (Not a window without completions: a slow server has those.)
	failing := win.done > win.abandoned && l.failingLately()
	if l.calmRun >= calmWindows || failing {
		l.endSuspect()
		return
	}
	// While the completions still grow (the cap with them), the server
	// is still finding its throughput: a ramp, not yet an overload. An
	// open loop saturates it, and the count goes on; suspectMaxWindows
	// bounds the whole. Nor does the phase run out while its cap still
	// grows, twice within stillGrowing windows, and its oldest waiter
	// can still be served in time: the evidence that the work became
	// slower rather than queued can come late (it needs a fast request
	// let in among the slow ones), and a phase that ran out at its
	// suspectMax-th window without growth while its cap was doubling
	// every window refused the waiters of a healthy mix (busy's mix over
	// TCP; TestLateEvidenceStillGrowing; the simulator's mix of
	// TestSlowerMixNeverRefused over 200 seeds, with fast requests of
	// 4.5, 7 and 9 ms: 4, 2 and 6 seeds refusing at 192 slow requests a
	// second, now 2, 1 and 4; 26, 21 and 25 at 256, now 17, 16 and 13;
	// with roomFor's reading of one below the cap as well, 2, 0 and 3,
	// and 17, 12 and 15).
	// Not where the oldest waiter can no longer be served in time: the
	// phase would only hold the waiters of a ramp with short deadlines
	// until they left (TestStillGrowingNotForLateWaiters).
	l.suspectAll++
	if growing {
		l.grewAt = [2]int64{l.suspectAll, l.grewAt[0]}
	} else {
		l.suspectFor++
	}
	l.sq.mu.Lock()
	waiting := l.sq.live()
	l.sq.mu.Unlock()
	full := waiting > max(maxSuspectQueue, suspectPerSlot*l.suspectCap.Load())
	growingLately := l.grewAt[1] >= 0 && l.suspectAll-l.grewAt[1] <= stillGrowing && l.oldestInTime()
	if !full && (l.suspectFor < l.suspectMax || growingLately) && l.suspectAll < suspectMaxWindows {
		return
	}
	if l.answerProbe.surelyOpen(l) {
		// The second half already holds too many arrivals to fall: an
		// open loop, whose answers need wait no longer.
		l.answerProbe.stop()
		l.answerTried = true
	}
	if !full && (l.answerProbe.on || !l.answerTried && l.startAnswerProbe()) {
		return
	}
	l.answerProbe.stop()
	l.mdl.reset(l.winStart)
	c := l.counters()
	l.spinBefore = l.offeredRate(rateWindows)
	if phase := l.now() - l.suspectFrom.Load(); phase > rateWindows*int64(l.cfg.Window) {
		l.spinBefore = max(l.spinBefore, float64(c.arrived+c.refused-l.suspOffered)/float64(phase))
	}
	l.perFull = 0
	if done := c.done - l.suspDone; done > 0 {
		l.perFull = (l.now() - l.suspectFrom.Load()) / done
	}
	l.idleUnder.Store(l.idleWorkers())
	l.spinAt, l.spinFrom, l.spinOthers = l.now(), c.arrived+c.refused, l.others.Load()
	l.seeded = false
	l.free.Store(&freeLatencies{from: l.now()}) // before overloaded: see Release
	// Overloaded first: a request that arrives between the two stores
	// meets the overload rule, not no rule at all (gate reads
	// overloaded first).
	l.overloaded.Store(true)
	l.suspect.Store(false)
	l.growthRun, l.calmRun, l.overSince = 0, 0, 0
	l.following = false
	l.startJudging()
	if full {
		l.releaseSuspect(false)
		return
	}
	// The waiters wait on until the new arrivals' answers tell a closed
	// loop from an open one (verdict), for spinWindows windows at most,
	// on a timer (windows end only with events: arrivals that stopped
	// with the overload's start left the waiters waiting for the next).
	l.pending = true
	l.spinCheck.Store(c.refused + l.spinWorth(spinRatio))
	at := l.spinAt
	l.afterFunc(time.Duration(spinWindows)*l.cfg.Window, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.pending && l.spinAt == at {
			l.verdict(true)
		}
	})
}

// verdict decides, while an overload that began with waiters is at most
// spinWindows windows old (at the end of each window, when the refusals
// reach spinCheck, and when the windows are over, for good: final),
// whether its waiters are an overload's (refused) or a closed loop's
// callers (the server is suspect again, and they wait on): a closed
// loop's callers, refused, send again at once, and the first attempts
// offered since the overload began come at several times the rate of
// before (the bar: see spinRatio). An open loop's new arrivals do not
// follow the answers; its callers that retry come back as retries. The
// first window's end that does not decide refuses some of the newest
// waiters (spinSeed), so that a closed loop shows even where its
// refused callers come back slowly. It reports whether it decided. l.mu
// is held.
func (l *Limiter) verdict(final bool) bool {
	dur := l.now() - l.spinAt
	c := l.counters()
	offered := c.arrived + c.refused - l.spinFrom - (l.others.Load() - l.spinOthers)
	ratio := 0.0
	if l.spinBefore > 0 && dur > 0 {
		ratio = float64(offered) / float64(dur) / l.spinBefore
	}
	bar := max(spinRatioLater, spinRatio*float64(l.cfg.Window)/float64(max(dur, 1)))
	closed := offered >= probeArrivals && ratio >= bar
	if !closed && !final {
		l.spinCheck.Store(c.refused + probeArrivals)
		if !l.seeded && l.overSince > 0 {
			l.seeded = true
			l.sq.mu.Lock()
			l.sq.refuseNewest(int(l.spinWorth(spinSeed)))
			l.sq.mu.Unlock()
		}
		return false
	}
	l.pending = false
	l.spinCheck.Store(0)
	if !closed {
		l.closedAt = 0
		l.releaseSuspect(false)
		return true
	}
	// A closed loop's callers: the server is suspect again, and they
	// wait on, oldest first from now on (while the oldest can still be
	// served in time: see dispatchSuspect). Newest first, the oldest
	// waited out the whole ramp (the p99 of a ramp of 1 024 callers
	// over 3 s into a pool, over TCP, 3.2 s against 1.4 s without a
	// limiter); let in at once, the ramp's next callers made the server
	// suspect and overloaded again, twice as often. Suspect before not
	// overloaded: a request that arrives between meets a rule.
	l.suspectAgain()
	l.endOverload()
	l.dispatchSuspect()
	return true
}

// spinWorth returns windows windows' worth of the arrivals of before the
// overload (spinBefore), at least probeArrivals. l.mu is held.
func (l *Limiter) spinWorth(windows float64) int64 {
	return max(probeArrivals, int64(windows*l.spinBefore*float64(l.cfg.Window)))
}

// spinEarly runs the verdict before the window's end, once the refusals
// since the overload began reach spinCheck: a closed loop's callers
// that come back within a fraction of a window are told apart after
// spinRatio windows' worth of the arrivals of before, not after a
// window of them spinning (over TCP 100-500 refusals; where refused
// callers come back within 100 µs, and after spinSeed's refusals,
// thousands).
// It never waits for l.mu: the window's end decides if it cannot.
func (l *Limiter) spinEarly() {
	if !l.mu.TryLock() {
		return
	}
	defer l.mu.Unlock()
	if l.pending {
		l.verdict(false)
	}
}

// endSuspect ends the suspect phase: the server is calm, and everyone
// waiting goes in. l.mu is held.
func (l *Limiter) endSuspect() {
	l.suspect.Store(false)
	l.answerProbe.stop()
	l.growthRun, l.calmRun = 0, 0
	l.releaseSuspect(true)
}

// hangAfter is how long a server with mean latency mean serves nothing
// before that reads as a hang below it: four mean latencies, at least
// maxWindows windows.
func (l *Limiter) hangAfter(mean int64) int64 {
	return max(4*mean, maxWindows*int64(l.cfg.Window))
}

// errSuspectRefused marks a waiter refused when the server became
// overloaded: the arrivals it waited behind were an overload.
var errSuspectRefused = ErrOverload

// releaseSuspect ends every wait: admitted (under Config.MaxInFlight,
// if set), or to be decided again.
func (l *Limiter) releaseSuspect(admit bool) {
	l.sq.mu.Lock()
	ws := l.sq.waiters
	l.sq.waiters, l.sq.fifo = nil, false
	for _, w := range ws {
		if w.gone {
			continue
		}
		if admit && l.takeUnder(l.capAll) {
			l.fromQueue.Add(1)
			w.admitted = true
		}
		w.refused = !admit
		w.closed = true
		close(w.ready)
	}
	l.sq.mu.Unlock()
}

// refuseNewest refuses the newest n waiters still waiting. q.mu is held.
func (q *suspectQueue) refuseNewest(n int) {
	for i := len(q.waiters) - 1; i >= 0 && n > 0; i-- {
		if w := q.waiters[i]; !w.gone {
			n--
			w.refused, w.closed = true, true
			close(w.ready)
		}
	}
	kept := q.waiters[:0]
	for _, w := range q.waiters {
		if !w.closed || w.gone {
			kept = append(kept, w)
		}
	}
	clear(q.waiters[len(kept):])
	q.waiters = kept
}

// dispatchSuspect admits the newest waiter (the oldest after a closed
// loop's verdict, if it can still be served in time) while a slot under
// the cap is free.
func (l *Limiter) dispatchSuspect() {
	l.sq.mu.Lock()
	defer l.sq.mu.Unlock()
	for n := len(l.sq.waiters); n > 0; n = len(l.sq.waiters) {
		i := n - 1
		if l.sq.fifo && l.inTime(l.sq.waiters[0]) {
			// Oldest first, while the oldest can still be served in
			// time: where it cannot, newest first serves more of the
			// rest in time (a review's simulation: 2 048 callers with
			// 300 ms deadlines ramping into 64 workers of 20 ms, 5 086
			// served in time oldest first, 15 112 newest first).
			i = 0
		}
		w := l.sq.waiters[i]
		if !w.gone && !l.takeUnheld(ClassFirst) {
			return
		}
		if i == 0 {
			l.sq.waiters[0] = nil
			l.sq.waiters = l.sq.waiters[1:]
		} else {
			l.sq.waiters = l.sq.waiters[:i]
		}
		if w.gone {
			continue
		}
		l.fromQueue.Add(1)
		w.admitted, w.closed = true, true
		w.held = l.grew.Load() != nil // under the cap (not admitWaiter's, nor the phase's end)
		close(w.ready)
	}
}

// oldestInTime reports whether the oldest waiter still waiting can
// still be served in time (inTime), or none waits.
func (l *Limiter) oldestInTime() bool {
	l.sq.mu.Lock()
	defer l.sq.mu.Unlock()
	for _, w := range l.sq.waiters {
		if !w.gone && !w.closed {
			return l.inTime(w)
		}
	}
	return true
}

// inTime reports whether w can still be served within its caller's
// deadline if admitted now: no deadline, or more left than serving
// takes (three times the base latency, as admitBefore has it).
func (l *Limiter) inTime(w *suspectWaiter) bool {
	return w.budget == 0 || w.budget-(l.now()-w.since) > 3*l.baseNow.Load()
}

// suspectLimit is the concurrency a suspect server admits a request of
// class c under: the suspect phase's cap, and Config.MaxInFlight's for
// the class if lower (waiters, whose class is not kept, count as first
// attempts).
func (l *Limiter) suspectLimit(c Class) int64 {
	limit := l.suspectCap.Load()
	if fixed := l.capOf(c); fixed > 0 {
		limit = min(limit, fixed)
	}
	return limit
}

// takeUnder takes a slot if fewer than limit are in flight (limit 0: no
// limit), and reports whether it did.
func (l *Limiter) takeUnder(limit int64) bool {
	if limit <= 0 {
		l.inflight.Add(1)
		return true
	}
	for cur := l.inflight.Load(); cur < limit; cur = l.inflight.Load() {
		if l.inflight.CompareAndSwap(cur, cur+1) {
			return true
		}
	}
	return false
}

// takeUnheld takes a slot for a request of class c of the server's own
// if fewer of its own than the suspect phase's cap are in flight, and
// fewer than Config.MaxInFlight's cap for c in all, and reports whether
// it did. The requests held above that the server admitted while
// suspect (WaitHeld, heldIn) do not count against the suspect cap.
// Counted, they filled the cap of a tier below a gateway that held its
// slow requests (busy's mix over TCP: 47 of them in flight at payment,
// its cap 6), and the requests that the gateway's calm end let in,
// unmarked, waited until the cap had grown past them, which it did not
// before the phase ran out: an overload that refused 837.
func (l *Limiter) takeUnheld(c Class) bool {
	limit, fixed := l.suspectCap.Load(), l.capOf(c)
	for cur := l.inflight.Load(); cur-l.heldIn.Load() < limit && (fixed <= 0 || cur < fixed); cur = l.inflight.Load() {
		if l.inflight.CompareAndSwap(cur, cur+1) {
			return true
		}
	}
	return false
}

// suspectEnter admits a request of class c, with deadline (zero: none),
// that arrived at at while the server is suspect, at once under the cap
// (p), or returns the waiter it is to wait as (w; see await); neither
// when the server is no longer suspect.
func (l *Limiter) suspectEnter(c Class, deadline time.Time, at int64) (Permit, *suspectWaiter, error) {
	if l.takeUnheld(c) {
		p := l.permit(at, 0)
		p.held = l.grew.Load() != nil
		return p, nil, nil
	}
	if p, ok := l.trial(at); ok {
		return p, nil, nil
	}
	w := &suspectWaiter{ready: make(chan struct{}), since: at}
	if !deadline.IsZero() {
		w.budget = max(int64(deadline.Sub(l.wall(at))), 1)
	}
	l.sq.mu.Lock()
	if !l.suspect.Load() {
		l.sq.mu.Unlock()
		return Permit{}, nil, nil
	}
	l.sq.waiters = append(l.sq.waiters, w)
	l.entered.Add(1)
	l.sq.mu.Unlock()
	// A completion between the cap check and the push dispatched no one:
	// look again.
	if l.inflight.Load()-l.heldIn.Load() < l.suspectCap.Load() {
		l.dispatchSuspect()
	}
	return Permit{}, w, nil
}

// await waits as w until it is admitted or released, or ctx ends, or
// its deadline comes so close that it must go in (see admitBefore).
// settled false means the wait ended undecided (the server became
// overloaded, or is not suspect any more): the caller decides again.
func (l *Limiter) await(ctx context.Context, w *suspectWaiter, c Class, deadline time.Time) (p Permit, err error, settled bool) {
	if stop := l.admitBefore(w, c, deadline); stop != nil {
		defer stop()
	}
	select {
	case <-w.ready:
	case <-ctx.Done():
		l.sq.mu.Lock()
		if !w.closed {
			w.gone = true
			l.gone.Add(1)
			l.sq.mu.Unlock()
			return Permit{}, ctx.Err(), true
		}
		l.sq.mu.Unlock()
		if w.admitted {
			Permit{l: l}.Release(Ignored)
		}
		return Permit{}, ctx.Err(), true
	}
	return l.settle(w)
}

// admitBefore admits a waiter of class c beyond the cap when its
// caller's deadline leaves only what serving it takes (three times the
// base latency, or half of what was left when it began to wait if less),
// provided the server serves in time now: the mean latency of the last
// window (or a later window's least, if longer) fits both what is left
// and the overload rule's threshold for c.
// A suspect server cannot yet tell a ramp from an overload; a request of
// a ramp that waited until it could no longer be served would be refused
// by the wait itself, which a closed loop must never see. A server whose
// latency grew (it queues, or it slowed down) keeps its waiters. The
// latency measured, not the one Little's law expects from the time per
// completion: while the concurrency rises, that lags by a latency, and
// at a server that waits (any concurrency, the same latency) it expects
// several times the truth. It returns the timer's stop, or nil when
// there is none.
func (l *Limiter) admitBefore(w *suspectWaiter, c Class, deadline time.Time) (stop func() bool) {
	if deadline.IsZero() {
		return nil
	}
	left := deadline.Sub(l.wall(l.now()))
	room := min(left/2, left-3*time.Duration(l.baseNow.Load()))
	if room <= 0 {
		l.admitWaiter(w, c, left)
		return nil
	}
	return l.afterFunc(room, func() { l.admitWaiter(w, c, left-room) })
}

// admitWaiter gives w a slot beyond the suspect phase's cap (never beyond
// Config.MaxInFlight) if the server serves a
// request of class c in time now (see admitBefore) and served one
// lately, unless its wait has ended.
func (l *Limiter) admitWaiter(w *suspectWaiter, c Class, left time.Duration) {
	mean := l.lastMean.Load()
	if mean == 0 || mean > int64(left) || mean > l.threshold[c].Load() {
		return
	}
	if l.now()-l.servedAt.Load() > l.hangAfter(mean) {
		// Nothing served for that long: the mean is of before, and the
		// server's requests end at their callers' deadlines (a hang
		// below it). Admitted, the waiter would only join them.
		return
	}
	l.sq.mu.Lock()
	defer l.sq.mu.Unlock()
	if w.closed || w.gone {
		return
	}
	if !l.takeUnder(l.capOf(c)) {
		return // Config.MaxInFlight is never passed
	}
	w.gone = true // out of the stack: dispatch and release skip it
	l.fromQueue.Add(1)
	w.admitted, w.closed = true, true
	close(w.ready)
}

// settle is the outcome of a wait that ended: a slot, a refusal (the
// server became overloaded: the backlog it waited in is the overload's),
// or decide again (not suspect any more, and not admitted: rare).
func (l *Limiter) settle(w *suspectWaiter) (Permit, error, bool) {
	if !w.admitted {
		if w.refused || l.overloaded.Load() {
			// Not l.refused: it was counted as an arrival when it began
			// to wait, and counted again, it was offered twice.
			l.rejected[reasonOverload].Add(1)
			return Permit{}, errSuspectRefused, true
		}
		return Permit{}, nil, false
	}
	// The latency starts with the slot: the wait is not the server's.
	p := l.permit(l.now(), 0)
	p.held = w.held
	return p, nil, true
}
