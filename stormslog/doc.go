// Package stormslog logs stormguard's interceptor events with log/slog: refused
// retries, summed up per target and interval so that an outage logs a
// bounded number of lines, circuit breaker and adaptive throttle changes,
// a server's admission refusals and health changes, and callers that
// stack grpc-go's retry under a retrying interceptor.
// Successful calls log nothing.
//
// Install it like any interceptor.Observer:
//
//	o := stormslog.New(logger)
//	set, err := breaker.NewSet(breaker.Config{}, 0)
//	ic, err := interceptor.New(interceptor.WithObserver(o), interceptor.WithBreaker(set))
//	...
//	defer o.Flush() // the counts of the last interval
//
// Given both options, interceptor.New reports the set's breaker changes to
// the observer. To log and record metrics, give interceptor.WithObserver an
// Observer that calls both (stormotel.Metrics and this one).
//
// # Lines
//
//	| Event                          | Level | Message                                      | Attributes |
//	|--------------------------------|-------|----------------------------------------------|------------|
//	| retry refused: budget          | WARN  | stormguard: retry refused                    | target, method, reason, attempt, depth, in_handler, code |
//	| retry refused: breaker_open    | WARN  | stormguard: retry refused                    | (same) |
//	| retry refused: deadline        | WARN  | stormguard: retry refused                    | (same) |
//	| retry refused: throttled       | WARN  | stormguard: retry refused                    | (same) |
//	| retry refused: attempts        | INFO  | stormguard: retry refused                    | (same) |
//	| retry refused: tier_policy     | INFO  | stormguard: retry refused                    | (same) |
//	| retry refused: pushback        | INFO  | stormguard: retry refused                    | (same) |
//	| retry refused: committed, other| INFO  | stormguard: retry refused                    | (same) |
//	| more refusals in the interval  | as the reason | stormguard: retry refused, repeats   | target, reason, in_handler, repeats, interval |
//	| breaker entered open           | WARN  | stormguard: circuit breaker state changed    | target, from, to |
//	| breaker entered half-open      | INFO  | stormguard: circuit breaker state changed    | target, from, to |
//	| breaker entered closed         | INFO  | stormguard: circuit breaker state changed    | target, from, to |
//	| adaptive throttle: target down | WARN  | stormguard: target down                      | target |
//	| adaptive throttle: target up   | INFO  | stormguard: target back up                   | target |
//	| stacked retry, once per method | WARN  | stormguard: stacked retries                  | method, depth, attempt |
//	| admission refused: overload, deadline, limit, queue_timeout | WARN | stormguard: request refused | method, reason, code, attempt |
//	| admission refused: caller_gone | INFO  | stormguard: request refused                  | (same) |
//	| more admission refusals in the interval | as the reason | stormguard: request refused, repeats | reason, repeats, interval |
//	| health: NOT_SERVING (WithHealth) | WARN | stormguard: not serving                    | |
//	| health: SERVING on trial       | INFO  | stormguard: serving on trial                 | |
//	| more health changes in the interval | as the last | stormguard: health changes, repeats | to (the state the last entered), repeats, interval |
//	| retry scheduled                | DEBUG | stormguard: retry scheduled                  | target, method, attempt, depth, in_handler, delay |
//	| pushback sent                  | DEBUG | stormguard: pushback sent                    | method, depth, attempt, code |
//	| attempt start and end, request received | never |                                | |
//
// WARN marks a protection at work that an operator should look at: the
// budget, the adaptive throttle or an open breaker is shedding retries (or,
// for the throttle and the breaker, first attempts), a target is down, or
// deadlines are too short for the backoff; or a caller whose attempts
// multiply (grpc-go's retry under a retrying interceptor: the request
// carries both's metadata), logged for the first such request of each
// method (EventStackedRetry). INFO marks the design working as intended: a call used
// its attempts, a deeper tier deferred to the one above (tier_policy,
// pushback). WithLevel changes the level of a reason. With slog's default
// level (INFO), scheduled retries and pushbacks are not logged.
//
// # Volume
//
// Refusals are counted per target, reason and in_handler. The first one is
// logged as it happens and opens an interval (WithInterval, 1 s by
// default); the others of that interval are not logged one by one but as
// one "repeats" line with their count, written at the first event the
// Observer receives after the interval ends (or by Flush). So each target
// logs at most two refusal lines per reason and per value of in_handler in
// any interval, however many calls fail: an outage at any request rate
// logs a few lines a second per target. A server's admission refusals
// are counted by reason, and its health changes together (a server that
// is not serving lets a trial in every 200 ms, and changes twice per
// trial), the same way; a health summary names the state the last
// change entered. Breaker and throttle changes are
// logged one by one (a breaker changes state at most a few times per open
// interval, a throttle's target goes down at most once per outage).
// DEBUG lines are one per event: they are for debugging, not for
// production.
//
// # Attributes
//
// target is the key of the budget and breaker (the connection's target,
// plus the method under interceptor.WithPerMethodKeys), or OtherTargets
// once more than 1024 keys are being counted at once; method is the full
// gRPC method; reason is one of attempts, budget, breaker_open,
// tier_policy, pushback, deadline, throttled, committed (as stormotel's
// stormguard.reason); attempt is, for a refusal, the index of the attempt
// that was not made (the number of attempts made), for a scheduled retry
// the retry's index, and for a pushback the caller's attempt index; depth
// is the tier's distance from the edge (0 at the edge, and also 0 for the
// edge's own client, which serves no request); in_handler tells these two
// apart: true when the call is made from the context of a gRPC handler (a
// tier serving a request), false for a client with no incoming request
// (the edge client, or a handler that calls with a context of its own);
// code is the gRPC code of the failure that was not retried, the code the
// caller gets (Unavailable for a call an open breaker refused before its
// first attempt); repeats is the number of refusals of the interval after
// the logged one; delay is the wait before the retry; from and to are
// "closed", "open" and "half-open". Put them in a group with
// logger.WithGroup("stormguard").
package stormslog
