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
// by how their completions come: a server that fills up completes at a
// rate that grows with what it holds, so its completions accelerate
// (counted from the first, about four times as many when the time
// doubles, early on), while a pool completes at its fixed rate (twice
// as many). So:
//   - until the completions at half the time since the first are
//     coldDecided, the server is undecided, and holds no one (whileNot:
//     as a server with no base yet);
//   - while they grow by more than coldGrowth when the time doubles
//     (twice in a row, from coldMinDone at half the time), the total
//     time on test is the least base (floor);
//   - while the server is suspect, a floor above its base raises the
//     base (its cap, twice the completion rate times the base, would
//     otherwise hold the fill-up that shows the acceleration);
//   - the cold start ends when the server has run coldSpan times that
//     (the floor then stands for another history, as checkModel's
//     does: the history still holds the first answers), or when
//     coldSteadyDone completions at half the time grew by less than
//     coldSteady: a steady rate, a queue's, and a floor it set is
//     taken back.
//
// In the simulator (TestColdStartOfAWaitingServer; open loop from the
// first request, 8 seeds), servers waiting 100 ms, 300 ms and 1 s were
// refused 10-25 %, 19-60 % and 83-88 % of their first 10 s, now none.
// The price is the wait for a verdict: a pool that completes a few
// hundred requests a second, overloaded from its first request, builds
// a queue until it has 16 completions to compare (2 workers of 8 ms at
// eight times their capacity: p99 0.7-0.9 s, where it was 0.1 s; 16
// workers of 50 ms: 0.9-2.1 s, where it was 0.3 s). And a pool of 300 ms
// requests at twice its capacity after a closed loop's warm-up, whose
// base already follows its queue (doc.go, "Known limits"), keeps a
// slightly lower base from the warm-up's first windows, which no
// suspect phase now leaves out: 0.58x of its capacity served in time
// (median of 20 seeds) where it was 0.69x.

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
	// measure (a count's noise, 1/sqrt(n), is then 35 %: a steady rate
	// reads 2.5 in about one check in twenty, twice in a row rarely).
	coldMinDone = 8
	// coldDecided completions at half the time end the wait for a
	// verdict: a server that does not accelerate by then may become
	// suspect with the history's base.
	coldDecided = 16
	// coldSteadyDone completions at half the time that grew by less
	// than coldSteady show a steady rate (the noise is then 18 %): a
	// queue, or a server past its fill-up (an exponential latency's
	// completions grow by 2.3 at eight means).
	coldSteadyDone = 32
	coldSteady     = 2.3
	// coldMarks bounds the (time, completions) marks kept.
	coldMarks = 64
)

// coldStart is the total time on test since the first request, and the
// verdict on its completions.
type coldStart struct {
	on     atomic.Bool  // cold: new permits are counted
	first  atomic.Int64 // nanoseconds since origin of the first request, plus 1; 0: none yet
	done   atomic.Int64 // nanoseconds since origin of the first success, plus 1; 0: none yet
	starts atomic.Int64 // the sum of the starts of the counted requests in flight
	in     atomic.Int64 // the counted requests in flight
	latSum atomic.Int64 // the latencies of the counted successes
	latN   atomic.Int64 // the counted successes

	// Guarded by l.mu.
	marks   []coldMark // successes at the ends of windows, thinned to coldMarks
	floor   int64      // the total time on test while the completions accelerated; 0: none
	accel   int        // checks in a row that saw acceleration
	decided bool       // coldDecided completions at half the time
}

type coldMark struct{ at, n int64 }

// admitted counts a request that starts at at, and reports whether it
// is counted (its Release must then call released).
func (c *coldStart) admitted(at int64) bool {
	if !c.on.Load() {
		return false
	}
	if c.first.Load() == 0 {
		c.first.CompareAndSwap(0, at+1)
	}
	c.starts.Add(at)
	c.in.Add(1)
	return true
}

// released ends a counted request that started at start: rtt is its
// latency if it was served (Measured), else -1.
func (c *coldStart) released(start, rtt int64) {
	c.starts.Add(-start)
	c.in.Add(-1)
	if rtt >= 0 {
		if c.done.Load() == 0 {
			c.done.CompareAndSwap(0, start+rtt+1)
		}
		c.latSum.Add(rtt)
		c.latN.Add(1)
	}
}

// undecided reports whether the server is cold and cannot tell yet
// whether it fills up or queues: its base is not known. l.mu is held.
func (c *coldStart) undecided() bool { return c.on.Load() && !c.decided }

// update is the end of a window at at. When it ends the cold start, it
// returns the floor it had set, if any: to keep, after coldSpan times
// the latency (the history still holds the fill-up's first, fastest
// answers), or wrong, on a steady rate (a queue's latency, which the base
// must not keep). l.mu is held.
func (c *coldStart) update(at int64) (keep, wrong int64) {
	if !c.on.Load() {
		return 0, 0
	}
	n := c.latN.Load()
	if n == 0 {
		return 0, 0
	}
	ttt := (c.latSum.Load() + c.in.Load()*at - c.starts.Load()) / n
	if at-(c.first.Load()-1) >= coldSpan*max(ttt, c.floor) {
		keep = c.floor
		c.end()
		return keep, 0
	}
	c.mark(at, n)
	growth, m := c.growth(at, n)
	if m >= coldDecided {
		c.decided = true
	}
	if m >= coldSteadyDone && growth < coldSteady {
		wrong = c.floor
		c.end()
		return 0, wrong
	}
	if m >= coldMinDone && growth > coldGrowth {
		c.accel++
	} else {
		c.accel = 0
	}
	if c.accel >= 2 && n >= minSamples {
		c.floor = ttt
	}
	return 0, 0
}

func (c *coldStart) end() {
	c.on.Store(false)
	c.marks, c.floor = nil, 0
}

// mark records n successes at at, keeping every other mark when full.
func (c *coldStart) mark(at, n int64) {
	if len(c.marks) == coldMarks {
		for i := range coldMarks / 2 {
			c.marks[i] = c.marks[2*i+1]
		}
		c.marks = c.marks[:coldMarks/2]
	}
	c.marks = append(c.marks, coldMark{at, n})
}

// growth returns n successes at at over m, the successes at half the
// time since the first (the last mark before it).
func (c *coldStart) growth(at, n int64) (float64, int64) {
	done := c.done.Load() - 1
	half := done + (at-done)/2
	var m int64
	for _, k := range c.marks {
		if k.at > half {
			break
		}
		m = k.n
	}
	if m == 0 {
		return 0, 0
	}
	return float64(n) / float64(m), m
}
