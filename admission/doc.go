// Package admission decides on a server whether to start a request, and
// whether the server can serve at all.
//
// A [Limiter] refuses work only while the server is overloaded, and then
// only work that would wait longer than its latency target or past its
// caller's deadline, whichever comes first: a long deadline does not
// exempt a request from the target. In a user's trial, an interactive
// caller (200 ms deadlines) surged to 1.5x the capacity of a server that
// a batch job (10 s deadlines) shared: the interactive caller was served
// 29-54 % a half second against 0.5-32 % with retries off, and the batch
// job lost 30-56 % of its requests, which retries off served from the
// queue in 205 ms. To let a kind of caller wait, serve it from a server
// of its own, or give that server a larger Config.Target. Overloaded means that requests arrive
// faster than they complete, for several windows in a row: a server at
// capacity whose load comes from a fixed number of callers that each send
// the next request when the last is answered (a load test, a batch job, a
// worker pool) keeps up by definition, however many callers and however
// long the latency, and is never refused anything. Nor is a tier whose
// latency is its dependency's, or that of its own retries' backoff:
// latency is not load. While overloaded, a request is refused when the
// latency it can expect (Little's law: the requests in flight times the
// time per completion, while they are more than the server has workers)
// exceeds the server's latency without a queue by
// more than the latency target of its [Class] (Config.Target, 20 ms, the
// queueing time DAGOR sheds at; less for retries, which go first), or
// exceeds its own remaining deadline. The latency without a queue is the
// mean latency of the server's successes over its recent history; when
// the requests the rule admits take longer than it expected by more than
// the target, and unrelated to what it expected (a server that waits on
// something rather than queues: its requests take their latency however
// many are in flight), it is raised to what they take. At a cold
// start, while the completions still accelerate (a server filling up,
// not a queue), the base is at least the total time on test: the
// latencies of its successes plus the ages of the requests in flight,
// over the successes, which the first, fastest answers alone
// underestimate (see coldStart in cold.go); until it can tell, it holds
// no one. Known limits: a pool that completes only a few requests a
// window (64 workers of 300 ms), at twice its capacity, stays suspect
// until its tests of calm have spanned 64 events, and some of what it
// held waits until its callers' deadlines (0.75-0.87x of its capacity
// served in time with 1 s deadlines, where tests of calm over two
// windows, passed by chance, left 4 runs of 6 at 0.17-0.25x); a cold
// one (4 workers of 50 ms) keeps the base of its first, fastest answers
// until 8 requests admitted with nothing in flight tell it more
// (0.58-0.93x in time); one that completes a few a second,
// overloaded from its very first request, builds a queue past its
// callers' deadlines before its first answers tell (p99 1-19 s where it
// was 0.9-6.5 s); an overload that ends after a second or two (open-loop
// bursts of 1.5x for 0.5-1 s, one replica of three carrying the load
// while a deploy restarts the others, a cold replica), which a server
// without a limit serves within its callers' deadlines from its queue,
// is refused in part once it outlasts the suspect phase (users' trials:
// 69-94 % served against 79-100 %): the rule cannot tell it from the
// start of a long one, whose queue the latency target is there to bound;
// two pauses of the whole process of a second each
// during one overload raise the base to about what they took; a server
// whose slow requests wait on a dependency that queues, next to fast
// ones (cache hits), lets more in while its fast requests stay fast, and
// its callers' deadlines end its suspect phases calm (a review's
// simulation: a database of 8 connections at 1.75x, p99 of what was
// served 0.6-0.76 s where it was 64-218 ms, as many served; see roomFor
// in suspect.go); an open loop that joins a load test's ramp is told
// only at the end of a suspect phase, as before, and then a hold of 80
// ms later where a closed loop was found within the last 100 windows
// (a review's simulations of such joins: 0.4 % fewer served in time
// over 364 runs, up to 16 % fewer in single ones); and after
// a hang below a server whose latency spreads, the requests admitted in
// the hang's last part (nothing completing, the overload rule admits)
// stay in flight until their callers' deadlines, and the rule counts
// them as a queue ahead of every new request: it refuses healthy
// traffic until they end (a 30 ms exponential server at 300/s, a 1.5 s
// hang, 1 s deadlines: 69-261 of about 1 050 requests in the 3.5 s
// after the hang, in 9 of 12 seeds; none with a constant 30 ms). A
// trial (one request let in once nothing has succeeded for four mean
// latencies) ends such a state when it is served in time, and does end
// it where few requests arrive after the hang; where they keep
// arriving, the requests still hung make the server suspect again. The
// interceptor sends a trial's calls to a dependency that its client
// holds down as probes of it (Permit.Trial), and marks them so that the
// tiers below do the same (protocol section 2.6): one trial can show the
// whole chain below back.
//
// Why: a slow server with a FIFO queue keeps working on requests whose
// callers have given up, and callers with per-attempt timeouts retry into
// that queue, so it never drains (a metastable failure); and open-loop
// arrivals above capacity (users who do not wait for each other) build a
// queue without bound. Both are arrivals exceeding completions. A limit
// derived from latency alone, the family of Netflix's Gradient2 and
// Envoy's adaptive concurrency filter that this package used before,
// cannot tell them from a healthy server at capacity or from a tier that
// waits on a slow dependency, and refused most of their traffic.
//
// A closed loop that is still ramping up (a load test starting its
// callers) looks like the start of an overload: a suspect server queues
// rather than refuses until the arrivals have exceeded the completions
// for long enough. It is calm again, and admits everyone waiting, once
// what it holds (in flight and waiting) stops growing while it serves; a
// waiter whose deadline comes close goes in while the server serves in
// time; and a server with no measured latency yet, or whose completions
// all fail (failing, not busy), holds no one. A request that ends
// because its caller left (Abandoned: its deadline ran out while a
// dependency hung, or its answer came too late) is neither served nor a
// failure: a server whose requests all end that way holds what it holds
// instead of sending it into the hang. A refused closed loop sends again
// at once, so that its refused arrivals exceed its completions and it
// looks overloaded for good; a probe tells it from an open loop (see
// Limiter). A ramp that outlasts the suspect phase (512 callers started
// over 1.5 s) makes the server overloaded all the same; the waiters then
// wait a little longer, and the callers refused meanwhile, sending again
// at once, show a closed loop: the server is suspect again (see verdict
// in suspect.go). Such an overload refuses the callers' spin
// until the verdict: the first attempts offered since it began, against
// the rate of before, at a bar that falls as the evidence accumulates,
// with some of the newest waiters refused at once where the first window
// does not tell (their callers come back if they are a closed loop).
// Once a verdict has found a closed loop, or where none of the callers
// waiting set a deadline of a second or less (none at all, or a load
// tool's default: ghz sends 20 s), the suspect phases the ramp outlasts
// are told without a refusal: the server holds its
// answers for 80 ms (Limiter.HoldAnswer, which the interceptor calls
// after each request), and a closed loop's arrivals fall to its new
// callers while an open loop's go on (not where the callers waiting
// could not be served within their deadlines: a verdict's refusals send
// them again sooner; nor below about 800 arrivals a second). Over TCP,
// ramps of 512 and 1 024 callers into a pool had 379-384 and 748-767 of
// their requests refused a run with a verdict in every phase, 93-94 and
// 93-97 with the hold after the first verdict (3 runs each,
// interleaved; none without a limiter), and none once callers without
// a deadline (ghz's --timeout 0) or with ghz's default of 20 s met no
// verdict at all (the price: an open-loop overload of such callers
// holds its answers once, at its start, up to 80 ms; callers whose
// deadlines are a second or less still meet the verdict); before the bar fell and
// waiters were refused to tell, a spin that came back slowly (a
// CPU-saturated chain) was taken for an open loop in 8 of 16 runs and
// refused until the next probe, 8 400-22 200 a run (2026-12-07).
//
// In a chain, each tier's limiter holds on its own, and a request held
// at the gateway is held again at each tier below it. Where a limiter
// holds because its requests became slower rather than queued (its
// suspect cap grew on that evidence), the requests it admits report it
// (Permit.Held); the interceptor marks the calls made for them, and the
// tiers below, which wait on the same slow work, admit them with
// Limiter.WaitHeld, which does not hold them (up to 8 times the cap in
// flight; protocol section 2.7), nor counts them against the cap for
// the requests it holds of its own. Over TCP, a server of fast requests
// given slow ones as well (busy's mix: 50 fast and 192 slow a second,
// three tiers that wait on the slow ones) served 26-30 % in most runs
// with a hold at every tier, 100 % in most runs with the first tier's
// alone (5 of 37 collapsed), and in all but 3 of about 200 since the
// suspect cap grows on the work's evidence at half of one slot's rate.
//
// Config.MaxInFlight adds a fixed cap, with an optional short queue
// (Config.QueueSize; Limiter.Wait: CoDel-style timeouts, and the newest
// first when the queue is backed up), for a server that must never run
// more than so many requests at once.
//
// [Serving] is the server's other self-protection: whether it can serve at
// all, judged from its own answers, for gRPC health checking (a server
// whose database is down says NOT_SERVING, and its clients stop sending
// until a trial shows it can serve again).
//
// The gRPC glue is interceptor.WithAdmission and interceptor.WithHealth;
// this package imports only the standard library.
package admission
