package adaptive

// The down decision and the probe credit, sized so that random failures
// stay invisible at every request rate (issue 13, review finding 1): a
// quiet client sees no accepts between its own attempts, so silence
// alone cannot tell a dead target from a random failure there.

// enoughEvidence reports whether the overload failures since the last
// accept (t.run, the one just reported included) are enough to mark the
// target down, once they have lasted DownAfter: one failure while the
// connection is not ready (a strong, cheap signal of a dead process:
// random failures come on a ready connection), minColdRun for a target
// that never accepted anything, and otherwise downRun in a row (0.3^8,
// about 7e-5, at 30 % random failures). t.mu is held.
func (t *Throttle) enoughEvidence() bool {
	switch {
	case !t.accepted:
		return t.run >= minColdRun
	case t.broken:
		return true
	}
	return t.run >= downRun
}

// quietRunMin is the run of failures from which a quiet client's retry
// is refused.
const quietRunMin = 2

// quietRun reports whether a retry is refused because the target has
// failed twice in a row or more, the last failure DownAfter or more
// after the last accept. A client too quiet to see accepts between its
// attempts retries only a lone failure (two attempts: 91 % success at
// 30 % random failures), so that a dead target behind a ready
// connection gets one retry per replica, not one per request until
// downRun failures have come. A busy client sees accepts within
// DownAfter and keeps its retries up to retryRun.
//
// The silence is measured to the last failure, not to now: a caller
// asks before it waits its backoff (RetryAllowed) and again after it
// (Allow), and a backoff that itself carried the silence past DownAfter
// refused, after the wait, a retry that the first answer allowed (a
// client sending one call after another, whose target failed twice:
// the second retry waited up to 100 ms and was refused in a third of
// the calls). t.mu is held.
func (t *Throttle) quietRun() bool {
	return t.accepted && t.run >= quietRunMin && t.lastFail-t.lastAccept >= int64(t.cfg.DownAfter)
}

// probeNeed is the probe credit the next probe of a down target needs.
// A target marked down on a run of failures behind a ready connection
// (t.early), after an accept or from a cold start, may be a false alarm:
// its first probe needs one request's credit (ProbeRatio: the first
// request after the jittered gap), and each later one twice the one
// before, up to a whole probe (1/ProbeRatio requests). A false "down" so
// costs a client a request or two at any rate (a quiet client whose
// first call met three failures used to need 1/ProbeRatio requests, 19 s
// at 1 request/s), and a dead target soon gets only ProbeRatio of the
// requests. A target down while its connection was broken needs a whole
// probe from the start: its connection coming back revives it
// (Connectivity). t.mu is held.
func (t *Throttle) probeNeed() float64 {
	if !t.early {
		return 1
	}
	need := t.cfg.ProbeRatio
	for i := 0; i < t.probes && need < 1; i++ {
		need *= 2
	}
	return min(need, 1)
}

// creditFloor returns the probe credit per nanosecond that a down
// target's requests bring at least, for a target marked down at el:
// ProbeRatio of the accepted attempts per nanosecond of the window
// before the down, up to one probe per Window. Each request adds
// ProbeRatio, or, if more, that rate times the time since the last
// request (up to a Window): requests that became rare while the target
// was down (a tier above holds them back: its own throttle, or a plain
// tier that drops the "do not retry" answer, so that a stormguard
// client above it calls the healthy tier next to it down) probe as the
// requests before the down would have. Counted per request, the 8 a
// second that such a tier let through of the 730 before gathered a
// probe every 2.5 s, and the tiers held each other shut for 1.25-3.75 s
// after payment was back (a user's trial). So a client's probes of a
// dead target stay within ProbeRatio of what it sent before the outage
// or sends during it, whichever is more, and at most one a Window more
// than ProbeRatio of what it sends: a client as quiet before the down as
// after it probes as before (the accepts, not the failures that marked
// the target down; the time since its last request, up to a Window: a
// review found a client at one request per 20 s probing with each).
// t.mu is held.
func (t *Throttle) creditFloor(el int64) float64 {
	_, acc := t.sum(el)
	w := float64(t.cfg.Window)
	return min(t.cfg.ProbeRatio*float64(acc)/w, 1/w)
}

// failingRun reports whether a run of failures stops retries: retryRun
// overload failures in a row, and either no accept for a tenth of
// DownAfter (5 ms by default: a dead target at 1000 requests/s has 8
// failures and 8 ms of silence) or fewer than half of the window's
// requests accepted (a partial loss, where retries compete with first
// attempts for what is left). With one replica of three failing
// everything at once while the others take their time, its fast failures
// come back in runs between accepts; counted alone they refused the
// retries that the healthy replicas would have served. A run whose
// failures all came within that tenth of DownAfter is the calls in
// flight on a connection that broke (a replica of several killed), which
// fail together: it stops retries only after DownAfter without an
// accept, so that the other replicas serve its retries even on a machine
// too busy to read their answers within 5 ms (a user's trial: 64
// callers, each of three replicas killed in turn, up to 62 calls per
// deploy failed on retries refused so, while the two others served); at
// a dead target the failures go on and make a run within milliseconds.
// t.mu is held.
func (t *Throttle) failingRun(el int64) bool {
	if t.run < retryRun {
		return false
	}
	quiet := int64(t.cfg.DownAfter) / 10
	if t.lastFail-t.runStart < quiet {
		quiet = int64(t.cfg.DownAfter) // failures that came together
	}
	if !t.accepted || el-t.lastAccept >= quiet {
		return true
	}
	req, acc := t.sum(el)
	return req < minRequests || 2*acc < req
}
