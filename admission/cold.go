package admission

import "sync/atomic"

// The base at a cold start.
//
// The base is the mean latency of the successes in the history. At a
// cold start that history holds only the requests that have completed,
// and where latencies spread (a handler that waits on a dependency) the
// first to complete are the fastest: a server waiting 300 ms on average
// (exponentially) got a base of 6 ms from its first four answers, became
// suspect at once, held what it had in flight there, became overloaded,
// and refused 30 % of an open loop that never overloaded it over 15 s
// (a server waiting a second: 74 %, for good in most runs). The
// requests still in flight are the rest of that sample: each has taken
// at least its age so far. The total time on test (the latencies of the
// successes plus the ages of the requests in flight, over the number of
// successes) is the maximum-likelihood estimate of an exponential
// latency's mean; for latencies that spread less it reads high, which
// errs towards admitting.
//
// A pool overloaded from its first request holds its queue in flight
// too, and would take it for its latency (64 workers of 5 ms at eight
// times their capacity: a base of 75 ms). The two tell themselves apart
// by how their completions (served or abandoned) come: a server that
// fills up completes at a rate that grows with what it holds, so its
// completions accelerate (counted from the first, about four times as
// many when the time doubles, early on), while a pool completes at its
// fixed rate (twice as many); and a queue's requests take most of the
// time since the first request, a filling server's about half. So:
//   - the server is undecided, and holds no one (whileNot: as a server
//     with no base yet), until its completions tell: coldDecided of
//     them at half the time since the first that no longer accelerate,
//     or coldShareDone since then that took, on average, coldQueued or
//     more of the time since the first request (a queue at more than
//     three times the capacity, or requests abandoned), or a floor;
//   - while they grow by more than coldGrowth when the time doubles
//     (coldStreak checks in a row, from coldMinDone at half the time),
//     most were served, and Little's latency of what is in flight (in
//     flight x time per completion) is within one and a half times the
//     total time on test (equal in a fill-up, twice in a queue that
//     grows at a steady rate), the total time on test is the least
//     base (floor);
//   - while the server is suspect, a floor above its base raises the
//     base (its cap, twice the completion rate times the base, would
//     otherwise hold the fill-up that shows the acceleration);
//   - the cold start ends when the server has run coldSpan times that
//     latency since its first completion, or when coldSteadyDone
//     completions at half the time grew by less than coldSteady (a
//     steady rate); a floor then stands for another history, as
//     checkModel's does: the history still holds the first answers.
//
// The sums are relative to the first request: one read while a request
// changes it is off by at most the time since then, over the served.
//
// In the simulator, open loop from the first request a second after
// the limiter starts (TestColdStartOfAWaitingServer and 12-seed runs),
// servers waiting 100 ms, 300 ms or 1 s on average, at 200-1 000
// requests a second, or 20 or 200 ms (half each), or 100 ms exactly,
// were refused in 0-12 of 12 seeds, 7-84 % on average (none for the
// constant latency); now in none but one of 12 seeds of the bimodal
// server (12 %) and 5 of 12 of the 1 s server at 1 000/s (19 % on
// average, from 84 %). Pools overloaded from their first request keep
// their protection where they complete hundreds a second or more
// (TestColdStartOfAPool, TestColdStartOfASlowPool: 2 workers of 8 ms
// at 8x, p99 90-110 ms, before 90-110 ms). The price is with pools that
// complete a few requests a second, 1 s deadlines, overloaded from
// their first request, whose queue grows until their first answers
// tell, and which were already far from any target: p99 1.0-19 s where
// it was 0.9-6.5 s (1-8 workers of 50-300 ms at 4-8x, 28 runs).

const (
	// coldSpan is how many times its latency a server runs before its
	// base is its history's alone: an exponential latency's requests in
	// flight are within 2 % of their steady number after four means.
	coldSpan = 4
	// coldGrowth is the growth of the completions over a doubling of
	// the time since the first that shows acceleration: 2 for a steady
	// rate; 2.66 or more for an exponential latency's fill-up, over its
	// first four means.
	coldGrowth = 2.5
	// coldMinDone completions at half the time make the growth a
	// measure (a count's noise, 1/sqrt(n), is then 35 %).
	coldMinDone = 8
	// coldDecided completions at half the time that no longer
	// accelerate end the wait for a verdict: the server may become
	// suspect with the history's base.
	coldDecided = 16
	// coldSteadyDone completions at half the time that grew by less
	// than coldSteady show a steady rate (the noise is then 18 %): a
	// queue, or a server past its fill-up (an exponential latency's
	// completions grow by 2.3 at eight means).
	coldSteadyDone = 32
	coldSteady     = 2.3
	// coldStreak checks in a row that see acceleration make the total
	// time on test the floor: a steady rate reads accelerating in about
	// one check in ten at coldMinDone, and checks in a row share most
	// of their counts, which is why the floor also asks Little's law.
	coldStreak = 2
	// coldShareDone completions since half the time make their mean
	// share a measure (see coldQueued): few, since a slow pool's queue
	// grows while it waits for them.
	coldShareDone = 4
	// coldQueued: the mean share of what completions took in the time
	// from the first request to their end, above which they show a
	// queue: (f-1)/f for a queue that grows at f times the capacity,
	// about half for a server filling up.
	coldQueued = 0.7
	// coldMarks bounds the (time, completions) marks kept.
	coldMarks = 64
)

// coldStart is the total time on test since the first request, and the
// verdict on its completions. The times it sums are relative to the
// first request, so that a sum read while a request changes it is off
// by no more than the time since then.
type coldStart struct {
	on      atomic.Bool  // cold: new permits are counted
	first   atomic.Int64 // nanoseconds since origin of the first request, plus 1; 0: none yet
	starts  atomic.Int64 // the counted requests in flight: the sum of their starts, since first
	in      atomic.Int64 // the counted requests in flight
	spent   atomic.Int64 // the time the counted requests served took
	served  atomic.Int64 // the counted requests served (Measured)
	ended   atomic.Int64 // the counted requests served or abandoned: the completions the verdict counts
	endedAt atomic.Int64 // nanoseconds since origin of the first of them, plus 1; 0: none yet
	// share: the shares of the served and abandoned in the time from
	// the first request to their end, summed (millionths; see
	// coldQueued).
	share atomic.Int64

	// Guarded by l.mu.
	marks   []coldMark // completions at the ends of windows, thinned to coldMarks
	floor   int64      // the total time on test while the completions accelerated; 0: none
	accel   int        // checks in a row that saw acceleration
	decided bool       // the completions tell (see undecided)
}

// coldMark is what the cold start counted at the end of a window: the
// completions (served or abandoned) and the sum of their shares.
type coldMark struct{ at, n, share int64 }

// admitted counts a request that starts at at, and reports whether it
// is counted (its Release must then call released).
func (c *coldStart) admitted(at int64) bool {
	if !c.on.Load() {
		return false
	}
	if c.first.Load() == 0 {
		c.first.CompareAndSwap(0, at+1)
	}
	c.starts.Add(at - (c.first.Load() - 1))
	c.in.Add(1)
	return true
}

// released ends a counted request that started at start and took took,
// with outcome o. A request served is a sample of the latency, and a
// completion; one abandoned (its caller left) a completion only; one
// failed or ignored neither (failures are often fast, and a server
// failing at its start is no fill-up).
func (c *coldStart) released(start, took int64, o Outcome) {
	first := c.first.Load() - 1
	c.starts.Add(-(start - first))
	c.in.Add(-1)
	if o != Measured && o != Abandoned {
		return
	}
	if c.endedAt.Load() == 0 {
		c.endedAt.CompareAndSwap(0, start+took+1)
	}
	c.share.Add(int64(1e6 * float64(took) / float64(max(start+took-first, 1))))
	c.ended.Add(1)
	if o != Measured {
		return
	}
	c.spent.Add(took)
	c.served.Add(1)
}

// undecided reports whether the server is cold and cannot tell yet
// whether it fills up or queues: its base is not known. l.mu is held.
func (c *coldStart) undecided() bool { return c.on.Load() && !c.decided }

// update is the end of a window at at, with inflight requests in flight
// and per nanoseconds per completion lately. When it ends the cold start,
// it returns the floor it had set, if any, which stands for another
// history (the history still holds the fill-up's first, fastest
// answers). l.mu is held.
func (c *coldStart) update(at, inflight, per int64) (keep int64) {
	if !c.on.Load() {
		return 0
	}
	done := c.ended.Load()
	if done == 0 {
		return 0
	}
	first, n := c.first.Load()-1, c.served.Load()
	ttt := int64(0)
	if n > 0 {
		// A sum read while a request changed it is off by up to the
		// time since the first request, over n.
		ttt = max((c.spent.Load()+c.in.Load()*(at-first)-c.starts.Load())/n, 0)
	}
	since := c.endedAt.Load() - 1
	if ttt > 0 && at-since >= coldSpan*max(ttt, c.floor) {
		return c.end()
	}
	now := coldMark{at, done, c.share.Load()}
	c.mark(now)
	half := c.markAt(since + (at-since)/2)
	growth := 0.0
	m := half.n
	if m > 0 {
		growth = float64(done) / float64(m)
	}
	// The completions since half the time: their mean share of the
	// time since the first request shows a queue (see coldQueued).
	queued := now.n-half.n >= coldShareDone && float64(now.share-half.share) >= coldQueued*1e6*float64(now.n-half.n)
	if m >= coldDecided && growth <= coldGrowth || queued {
		c.decided = true
	}
	if m >= coldSteadyDone && growth < coldSteady {
		return c.end() // a steady rate: a fill-up that is over, or a queue
	}
	if m < coldMinDone {
		return 0
	}
	if growth > coldGrowth {
		c.accel++
	} else {
		c.accel = 0
	}
	// A floor needs Little's latency of what is in flight within one
	// and a half times the total time on test: equal in a fill-up,
	// twice it in a queue that grows at a steady rate.
	if c.accel >= coldStreak && n >= minSamples && c.servedMost(done) && 2*inflight*per <= 3*ttt {
		c.floor = ttt
		c.decided = true // its base is known
	}
	return 0
}

// servedMost reports whether most of the done completions were served,
// not abandoned: a server whose callers leave before their answers is
// no healthy fill-up, whatever its completions do.
func (c *coldStart) servedMost(done int64) bool { return 4*c.served.Load() >= 3*done }

// end ends the cold start and returns the floor it had set.
func (c *coldStart) end() (floor int64) {
	floor = c.floor
	c.on.Store(false)
	c.marks, c.floor = nil, 0
	return floor
}

// mark records k, keeping every other mark when full.
func (c *coldStart) mark(k coldMark) {
	if len(c.marks) == coldMarks {
		for i := range coldMarks / 2 {
			c.marks[i] = c.marks[2*i+1]
		}
		c.marks = c.marks[:coldMarks/2]
	}
	c.marks = append(c.marks, k)
}

// markAt returns the last mark at or before at (the zero mark if none).
func (c *coldStart) markAt(at int64) coldMark {
	var m coldMark
	for _, k := range c.marks {
		if k.at > at {
			break
		}
		m = k
	}
	return m
}
