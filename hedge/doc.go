// Package hedge is the delay of hedged requests ("The Tail at Scale",
// Dean and Barroso, 2013): a request whose answer has not come after a
// high percentile of its target's recent latency gets a second attempt,
// and the first answer wins. A Delay keeps one target's latencies in a
// two-part window and gives that percentile, or a fixed delay until it
// has enough of them.
//
// # Why this design
//
// A fixed hedge delay is right for one latency only: shorter than the
// target's usual latency it doubles the load, longer it never fires. A
// percentile follows the target: at the 95th, about 5 % of requests are
// hedged whatever the target's speed, and when the target slows down as
// a whole (its latency, not its tail) the delay grows with it instead of
// hedging everything. The window is two halves of Window/2, the older
// dropped as the next begins, so that latencies older than Window are
// forgotten without a timer. The histogram has 16 buckets per power of
// two from 1 µs (a bucket's bounds are at most 6 % apart) and reads a
// percentile as the upper bound of its bucket: a hedge a little late
// rather than early. Until MinSamples latencies came the delay is
// Config.Initial: with too few, a high percentile is the largest of a
// handful, or none.
//
// Whether to hedge at all (the retry budget, the adaptive throttle, a
// busy or down target, the attempt metadata of the chain) is the
// caller's decision; this package only says when. Every Delay has its
// own clock (Config.Clock), so tests drive it exactly. Record is a few
// atomic adds, Get an atomic load and, every Window/20, a scan of the
// histogram; nothing runs in the background, and nothing allocates.
package hedge
