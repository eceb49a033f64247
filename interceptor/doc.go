// Package interceptor provides gRPC client and server interceptors that
// retry without starting retry storms in multi-tier service chains.
//
// # The storm
//
// Edge -> gateway -> order -> payment, and every hop retries three times.
// Payment goes down. One user request becomes 3 x 3 x 3 = 27 calls at
// payment; backoff only spreads them over time. With these interceptors on
// every hop, the same request costs 3 calls at payment: order, the tier next
// to the failure, retries; every tier above passes the failure up at once.
//
// # How
//
//   - Backoff with full jitter, within the caller's deadline: a retry whose
//     wait would outlast the deadline is not started.
//   - Attempt metadata down the chain: each attempt carries x-retry-attempt
//     (absent on the first, "1" on the first retry, as go-grpc-middleware
//     sends it), x-call-depth and x-upstream-retries. The server
//     interceptor parses them into the handler's context (FromContext), and
//     the client interceptor reads that context when the handler calls the
//     next tier: a tier whose callers are already retrying does not retry
//     itself (DefaultTierPolicy).
//   - "Do not retry" up the chain: when a client gives up on a retryable
//     failure, the server of its tier answers its own caller with the
//     trailer grpc-retry-pushback-ms: -1 (gRFC A6), which stormguard and
//     grpc-go's built-in retry both honour.
//   - A retry budget per target (WithBudget): retries stay within 20 % of
//     requests, so under sustained failure payment sees about 1.2x its
//     traffic instead of 3x. A gRFC A6 throttle is the alternative
//     (WithThrottle).
//   - A circuit breaker per target (WithBreaker): when payment is really
//     down, calls fail fast with codes.Unavailable and payment's load drops
//     to near zero.
//   - An adaptive throttle per target (WithAdaptive, package adaptive), the
//     recommended protection with the budget: it sheds in proportion to
//     what payment accepts (never refusing capacity that exists), stops
//     retries into a failing target within milliseconds (not for the
//     failures of one broken connection's calls alone, whose retries
//     other replicas serve), marks payment down 50 ms or
//     more after its last accept whatever came before, on evidence that
//     random failures do not give (eight failures in a row, or one with
//     the channel not ready), and probes a little, often, closing on the
//     first answer, so users are back within a probe gap of payment.
//
// # Trade-offs
//
// A budget trades success for safety: with payment failing 30 % of calls at
// random, retries are held to 20 % of requests, so users see about 84 %
// success (0.7 + 0.2 x 0.7) where unlimited retries would give 97 %
// (1 - 0.3^3), at the price of 1.39x load (1 + 0.3 + 0.09) on a struggling
// service. Raise Ratio in budget.Config if your services have that
// headroom.
//
// # Wiring
//
// Build one Interceptors per tier with New and install DialOptions on the
// tier's client connections and ServerOptions on its server. DialOptions
// includes grpc.WithDisableRetry, so grpc-go's own retry layer cannot
// multiply stormguard's attempts unseen underneath it. Installing only
// UnaryClient or StreamClient with grpc.WithChainUnaryInterceptor leaves
// that layer on: add grpc.WithDisableRetry() yourself (a server reports a
// caller that did not, with EventStackedRetry).
//
// The tier that faces callers you do not control (the edge) uses
// WithUntrustedCallers, and no other tier does: the edge then starts the
// depth count for the tiers below it, and they read the depth and
// upstream retries that it and its successors send. Without it, forged or
// malformed metadata can only lower the attempts of a tier, under
// DefaultTierPolicy and TierPolicyConfig alike (see TierPolicy); the
// exceptions are MetadataTrial, which can get a probe to a dependency the
// tier's throttle holds down out early, at most one per probe interval,
// never a retry, and MetadataHeld, which gets requests past the hold of
// the tier's admission control, up to 8 times its suspect cap in flight
// (never past its refusals).
//
// # Hedging
//
// WithHedging hedges unary calls only. A stream would need every message
// the caller sends copied to each attempt in flight, and a stream commits
// at its first response header, which most servers send at once, so that
// a hedge could only cover the few milliseconds before it: the replay
// buffer (WithReplayBufferSize) already covers a failure in that window.
//
// # Errors
//
// A call that stormguard retried or stopped returns an *Error. Its status
// on the wire is the downstream's own (or a fixed text when stormguard
// refused the call itself: BreakerOpenMessage, ThrottledMessage; a call
// whose context ended while it waited gets Canceled or
// DeadlineExceeded), so a message does not grow along the chain, and
// stormguard's own texts name no target; a downstream's message passes
// as it is, including grpc-go's for a connection that failed at the
// calling tier, which names the address it dialed (SECURITY.md: map
// errors at the edge if callers must not see them). stormguard's account
// (attempts and the reason it stopped) is in Error() and in the
// observer's events.
// Return it from a handler as it is: an error that wraps it with %w is
// sent with its Error() string as the message.
//
// # In a CPU profile
//
// On a tier whose handlers call the next tier, the server interceptor
// may make room on the handler's stack before it runs: a profile then
// shows runtime.newstack under makeRoom, a dozen frames deep, where
// without it the same growth happens in grpc-go's client, thirty frames
// deep and at about twice the cost; such a handler then runs below
// inRoom, whose frame keeps the room from being taken back by the
// collector while the handler waits. It does so only for methods whose
// handlers' stacks are seen to grow; see stackroom.go.
package interceptor

// The code, bottom to top (each rule is stated once, where it lives):
//
//   - options and the wire protocol: options.go, metadata.go (the keys,
//     the server's per-request state), policy.go (the tier policy),
//     backoff.go, envoy.go, target.go, errors.go (StopReason, Error);
//   - the outcome and the mechanisms: outcome.go (how an attempt ended,
//     and what each mechanism hears: docs/protocol.md 4.3),
//     mechanism.go (the interface; the breaker, the retry limiter, the
//     observer), adaptive.go (the throttle), limiters.go; on the server,
//     admission.go and health.go behind serverMechanism;
//   - the retry loops: call.go (what the unary and stream loops share:
//     asking the mechanisms, classifying, deciding the next attempt),
//     unary.go, hedging.go (the option, the adaptive delays) and
//     hedged.go (the loop of a hedged call), stream.go, stream_send.go,
//     stream_recv.go;
//   - the gRPC adapters: client.go, server.go (and stackroom.go, room on
//     the handler's stack), interceptors.go (New), recommended.go,
//     observe.go, stacked.go.
