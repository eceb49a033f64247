// Package admission decides on a server whether to start a request: an
// adaptive concurrency limit derived from latency, which sheds retries
// before first attempts and refuses work whose deadline cannot be met.
//
// Why: a slow server with a FIFO queue keeps working on requests whose
// callers have given up, and callers with per-attempt timeouts retry into
// that queue, so it never drains (a metastable failure). Throughput is
// limit / latency: a limit that falls while latency rises above its
// long-term level keeps the queue short, and rises again the moment latency
// recovers. A [Limiter] is that limit (a gradient algorithm, in the family
// of Netflix's Gradient2 and Envoy's adaptive concurrency filter), plus two
// rules no latency-only limiter has: requests are admitted by [Class], so
// that retries use only part of the limit and go first under overload; and
// a request whose remaining deadline is shorter than the latency the server
// currently needs is refused before it takes a slot. An optional short
// queue (Config.QueueSize, off by default) lets a request that meets a
// full limit wait briefly for a slot (Limiter.Wait): CoDel-style
// timeouts, and the newest first when the queue is backed up.
//
// [Serving] is the server's other self-protection: whether it can serve at
// all, judged from its own answers, for gRPC health checking (a server
// whose database is down says NOT_SERVING, and its clients stop sending
// until a trial shows it can serve again).
//
// The gRPC glue is interceptor.WithAdmission and interceptor.WithHealth;
// this package imports only the standard library.
package admission
