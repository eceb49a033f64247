// Package adaptive is client-side overload protection per target: it
// sheds requests in proportion to what the target accepts, notices within
// a fraction of a second that the target is down, and while it is down
// lets through only a few jittered probes, closing on the first answer.
//
// # Why this design
//
// A circuit breaker that trips on a failure rate over a long window, and a
// retry budget that banks a share of ten seconds of requests, both
// remember too much: after seconds of healthy full load the window is full
// of successes, and for seconds after the target dies the client keeps
// sending it about three calls per user request. A breaker that is open
// refuses the part of a sick target's capacity that still works, and its
// open interval, doubled on every failed probe, holds users out after the
// target is back. Throttle combines three rules, each of which reacts to
// what happens now:
//
//  1. Proportional shedding (Google SRE book, "Handling Overload",
//     client-side throttling). Over a short window (Config.Window, 1 s, in
//     ten buckets) the throttle counts requests and accepts and rejects a
//     request locally with probability
//     max(0, (requests - K*accepts) / (requests + 1)). The target keeps
//     receiving about K times what it accepts, so the capacity that exists
//     is always used (never fewer users served than with retries off), and
//     the protection grows with the loss instead of being all or nothing.
//     Only overload outcomes count against the target (UNAVAILABLE,
//     RESOURCE_EXHAUSTED, a hang until a deadline); any other answer is an
//     accept. Random failures of 30 % leave p at zero for any K >= 1/0.7:
//     the default K = 3 is silent up to 2/3 failures. Requests are counted
//     when their outcome comes (or when shed), so that attempts in flight
//     do not look refused at low counts, and nothing is shed below ten
//     requests in the window (the down rule covers quiet clients).
//  2. Retries only into a healthy target. A retry is refused while the
//     target is down, after 8 overload failures in a row (a dead target at
//     1000 requests/s reaches that in 8 ms; at 30 % random failures it
//     happens to about one failure in 5000), and while p > 0: a retry into a failing target is what multiplies load,
//     and it cannot win capacity that the first attempts do not already
//     get. (A retry budget still bounds retries at random failures; the
//     throttle does not replace it.)
//  3. Down detection by silence, not by volume. An overload failure that
//     arrives when the target has accepted nothing for Config.DownAfter
//     (50 ms; from a cold start, when three or more failures have lasted
//     that long)
//     marks it down at once, whatever the window holds. At 1000
//     requests/s that is about fifty failed requests into an outage; at 1
//     request/s it is the first failure. At 30 % random failures, or
//     at a partial loss where the shedding keeps half the attempts
//     accepted, 100 ms without a single accept is practically impossible
//     at any rate where it would cost much. While down, a request may
//     probe when the probe credit (Config.ProbeRatio per request, 5 %)
//     holds a whole probe and the jittered Config.ProbeInterval (50 ms)
//     since the last probe has passed; every other request is refused
//     without touching the target. The first accept, from a probe or a
//     straggler, ends the down state with an empty window: the target is
//     back in full within one probe interval plus one round trip, after an
//     outage of any length, because nothing grows while it is down.
//     Likewise, once every attempt for DownAfter has been accepted, the
//     window forgets the loss it remembers, so that a target back from a
//     partial loss gets its traffic back at once rather than as the
//     buckets age.
//
// Probes are a share of each instance's own requests, with no per-instance
// minimum rate, so that a fleet of a thousand replicas that each see one
// request per second adds up to a small fraction of the fleet's load at a
// dead target, not a thousand probes per second. The price is that such a
// replica learns slowly that the target is back (about 1/ProbeRatio
// requests). Two signals end the down state without probe load:
// Connectivity, fed with the channel's state (a connection that broke and
// is ready again: the target's process is back), and Revive, for anything
// else that says so (an answer that carries the target's state, a health
// watch).
//
// Every Throttle has its own clock and random source (Config.Clock,
// Config.Rand), so tests drive it exactly. On a healthy target Allow is
// one atomic load, and Permit.Done one short mutex section; nothing
// allocates.
package adaptive
