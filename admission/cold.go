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
//     or coldFirst since then that took, on average, coldQueued or more
//     of the time since the first request (a queue at four or more
//     times the capacity, or its requests abandoned), or a floor;
//   - while they grow by more than coldGrowth when the time doubles
//     (coldStreak checks in a row, from coldMinDone at half the time),
//     most were served, and what is in flight is consistent with them
//     (Little's latency of it, in flight x time per completion, within
//     one and a half times the total time on test: a queue that grows
//     at a steady rate reads two), the total time on test is the least
//     base (floor);
//   - while the server is suspect, a floor above its base raises the
//     base (its cap, twice the completion rate times the base, would
//     otherwise hold the fill-up that shows the acceleration);
//   - the cold start ends when the server has run coldSpan times that
//     latency since its first completion (the floor then stands for
//     another history, as checkModel's does: the history still holds
//     the first answers); or when coldSteadyDone completions at half
//     the time grew by less than coldSteady, a steady rate: a fill-up
//     that is over, if Little's latency agrees with the total time on
//     test, which then stands as the floor; else a queue, and the base
//     is what the first coldFirst requests admitted took (they met no
//     queue; the first to complete are a pool's fastest too), the
//     history, which holds what the queue took since, no sample.
//
// The sums are relative to the first request: one read while a request
// changes it is off by at most the time since then, over the served.
//
// In the simulator (TestColdStartOfAWaitingServer; open loop from the
// first request, 8 seeds), servers waiting 100 ms, 300 ms and 1 s were
// refused 10-25 %, 19-60 % and 83-88 % of their first 10 s, now none.
// Pools overloaded from their first request keep their protection
// (TestColdStartOfAPool, TestColdStartOfASlowPool): 2 workers of 8 ms
// at 8x, p99 83-114 ms (before 88-114 ms); 16 of 50 ms at 8x,
// 250-586 ms (261-335 ms). The pools that complete a few requests a
// second with 1 s deadlines, which were already far from their targets
// (p99 0.7-5.6 s), read the same in 30 of 32 runs of a review's set, and
// 8.6 s and 18 s in the other two (0.8 s and 1.7 s before): their queue
// grew past the deadlines before the first answers told.

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
	// coldFirst completions make their share a measure (see
	// coldQueued), and the first coldFirst requests admitted are the
	// cohort of cohortLatency.
	coldFirst = 4
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
	// The first coldFirst requests admitted, which met no queue: how
	// many were admitted, their starts (plus 1) and, once they ended,
	// what they took (plus 1; negative if they were not served).
	cohortN                 atomic.Int64
	cohortStart, cohortTook [coldFirst]atomic.Int64

	// Guarded by l.mu.
	marks   []coldMark // completions at the ends of windows, thinned to coldMarks
	floor   int64      // the total time on test while the completions accelerated; 0: none
	accel   int        // checks in a row that saw acceleration
	decided bool       // the completions tell (see undecided)
}

// coldMark is what the cold start counted at the end of a window: the
// completions (served or abandoned), the served, and the sum of the
// completions' shares.
type coldMark struct{ at, n, served, share int64 }

// admitted counts a request that starts at at, and returns how: 0 not
// counted, 1 counted, 2 + i the i-th of the first coldFirst (its Release
// must call released with it when not 0).
func (c *coldStart) admitted(at int64) int8 {
	if !c.on.Load() {
		return 0
	}
	if c.first.Load() == 0 {
		c.first.CompareAndSwap(0, at+1)
	}
	c.starts.Add(at - (c.first.Load() - 1))
	c.in.Add(1)
	if c.cohortN.Load() < coldFirst {
		if i := c.cohortN.Add(1) - 1; i < coldFirst {
			c.cohortStart[i].Store(at + 1)
			return int8(2 + i)
		}
	}
	return 1
}

// released ends a counted request that started at start and took took,
// with outcome o. A request served is a sample of the latency, and a
// completion; one abandoned (its caller left) a completion only; one
// failed or ignored neither (failures are often fast, and a server
// failing at its start is no fill-up).
func (c *coldStart) released(start, took int64, o Outcome, how int8) {
	first := c.first.Load() - 1
	c.starts.Add(-(start - first))
	c.in.Add(-1)
	if i := how - 2; i >= 0 {
		if o == Measured {
			c.cohortTook[i].Store(took + 1)
		} else {
			c.cohortTook[i].Store(-took - 1)
		}
	}
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

// cohortLatency returns the total time on test at at of the first
// coldFirst requests admitted, which met no queue (unless the server
// has fewer workers): a pool's latency without one, where its first
// answers are the fastest of its workers' (64 workers of 20 ms: 1 ms).
func (c *coldStart) cohortLatency(at int64) int64 {
	var sum, n int64
	for i := range coldFirst {
		start := c.cohortStart[i].Load() - 1
		switch took := c.cohortTook[i].Load(); {
		case start < 0:
		case took > 0:
			sum, n = sum+took-1, n+1
		case took < 0:
			sum += -took - 1
		default:
			sum += max(at-start, 0)
		}
	}
	return sum / max(n, 1)
}

// undecided reports whether the server is cold and cannot tell yet
// whether it fills up or queues: its base is not known. l.mu is held.
func (c *coldStart) undecided() bool { return c.on.Load() && !c.decided }

// coldEnd is how a cold start ended, for the base (see roll).
type coldEnd struct {
	// keep: after coldSpan times the latency, the floor, which stands
	// for another history (it still holds the fill-up's first,
	// fastest answers).
	keep int64
	// queue: on a steady rate, the mean latency of the first answers,
	// which waited least; the history, which holds what the queue took
	// since, is no sample of the base.
	queue int64
}

// update is the end of a window at at, with inflight requests in flight
// and per nanoseconds per completion lately; it returns how the cold
// start ended, if it did. l.mu is held.
func (c *coldStart) update(at, inflight, per int64) (e coldEnd) {
	if !c.on.Load() {
		return e
	}
	done := c.ended.Load()
	if done == 0 {
		return e
	}
	first := c.first.Load() - 1
	ttt := int64(0)
	if n := c.served.Load(); n > 0 {
		// A sum read while a request changed it is off by up to the
		// time since the first request, over n.
		ttt = max((c.spent.Load()+c.in.Load()*(at-first)-c.starts.Load())/n, 0)
	}
	since := c.endedAt.Load() - 1
	if ttt > 0 && at-since >= coldSpan*max(ttt, c.floor) {
		e.keep = c.floor
		c.end()
		return e
	}
	n := c.served.Load()
	c.mark(coldMark{at, done, n, c.share.Load()})
	half := c.markAt(since + (at-since)/2)
	growth := 0.0
	m := half.n
	if m > 0 {
		growth = float64(done) / float64(m)
	}
	// The completions since half the time: their mean share of the
	// time since the first request shows a queue (see coldQueued).
	last := c.marks[len(c.marks)-1]
	queued := last.n-half.n >= coldFirst && float64(last.share-half.share) >= coldQueued*1e6*float64(last.n-half.n)
	if m >= coldDecided && growth <= coldGrowth || queued {
		c.decided = true
	}
	if m >= coldSteadyDone && growth < coldSteady {
		// A steady rate: a fill-up that is over, or a queue. What is in
		// flight takes its total time on test to complete in the first
		// (Little's latency); a queue that grows at a steady rate takes
		// about twice its mean since the first request.
		if ttt > 0 && 2*inflight*per <= 3*ttt && c.servedMost(done) {
			e.keep = max(c.floor, ttt)
		} else {
			e.queue = c.cohortLatency(at)
		}
		c.end()
		return e
	}
	if m < coldMinDone {
		return e
	}
	if growth > coldGrowth {
		c.accel++
	} else {
		c.accel = 0
	}
	if c.accel >= coldStreak && n >= minSamples && c.servedMost(done) && 2*inflight*per <= 3*ttt {
		c.floor = ttt
		c.decided = true // its base is known
	}
	return e
}

// servedMost reports whether most of the done completions were served,
// not abandoned: a server whose callers leave before their answers is
// no healthy fill-up, whatever its completions do.
func (c *coldStart) servedMost(done int64) bool { return 4*c.served.Load() >= 3*done }

func (c *coldStart) end() {
	c.on.Store(false)
	c.marks, c.floor = nil, 0
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
