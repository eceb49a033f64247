// Package stormslog logs stormguard's interceptor events with log/slog:
// one structured line per refused retry and per circuit breaker change,
// never one per successful call.
//
// Install it like any interceptor.Observer:
//
//	o := stormslog.New(logger)
//	set, err := breaker.NewSet(breaker.Config{OnStateChange: interceptor.BreakerObserver(o)}, 0)
//	ic, err := interceptor.New(interceptor.WithObserver(o), interceptor.WithBreaker(set))
//
// To log and record metrics, give interceptor.WithObserver an Observer that
// calls both (stormotel.Metrics and this one).
//
// # Lines
//
//	| Event                          | Level | Message                                      | Attributes |
//	|--------------------------------|-------|----------------------------------------------|------------|
//	| retry refused: budget          | WARN  | stormguard: retry refused                    | target, method, reason, attempt, depth, code* |
//	| retry refused: breaker_open    | WARN  | stormguard: retry refused                    | (same) |
//	| retry refused: deadline        | WARN  | stormguard: retry refused                    | (same) |
//	| retry refused: attempts        | INFO  | stormguard: retry refused                    | (same) |
//	| retry refused: tier_policy     | INFO  | stormguard: retry refused                    | (same) |
//	| retry refused: pushback        | INFO  | stormguard: retry refused                    | (same) |
//	| retry refused: committed, other| INFO  | stormguard: retry refused                    | (same) |
//	| breaker entered open           | WARN  | stormguard: circuit breaker state changed    | target, from, to |
//	| breaker entered half-open      | INFO  | stormguard: circuit breaker state changed    | target, from, to |
//	| breaker entered closed         | INFO  | stormguard: circuit breaker state changed    | target, from, to |
//	| retry scheduled                | DEBUG | stormguard: retry scheduled                  | target, method, attempt, depth, delay |
//	| pushback sent                  | DEBUG | stormguard: pushback sent                    | method, depth, attempt, code |
//	| attempt start and end, request received | never |                                | |
//
// WARN marks a protection at work that an operator should look at: the
// budget or an open breaker is shedding retries, or deadlines are too short
// for the backoff. INFO marks the design working as intended: a call used
// its attempts, a deeper tier deferred to the one above (tier_policy,
// pushback). WithLevel changes the level of a reason. With slog's default
// level (INFO), scheduled retries and pushbacks are not logged.
//
// Attributes: target is the key of the budget and breaker (the connection's
// target, plus the method under interceptor.WithPerMethodKeys); method is
// the full gRPC method; reason is one of attempts, budget, breaker_open,
// tier_policy, pushback, deadline, committed (as stormotel's
// stormguard.reason); attempt is, for a refusal, the index of the attempt
// that was not made (the number of attempts made), for a scheduled retry
// the retry's index, and for a pushback the caller's attempt index; depth
// is the tier's distance from the edge (0 at the edge); code is the gRPC
// code, omitted when the event carries none (*refusals carry none today);
// delay is the wait before the retry; from and to are "closed", "open" and
// "half-open". Put them in a group with logger.WithGroup("stormguard").
//
// During an outage every failing request that stops retrying logs a line;
// put a sampling or rate-limiting slog.Handler in front of the output when
// that volume matters.
package stormslog
