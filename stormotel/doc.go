// Package stormotel records stormguard's interceptor events as OpenTelemetry
// metrics, through the OTel metric API only: bring your own MeterProvider.
//
// Three observers, one per part of stormguard: Metrics (New) for calls,
// retries, budgets, breakers and the server's view of its callers;
// AdaptiveMetrics (NewAdaptive) for the adaptive throttle; Admission
// (NewAdmission) for admission control and health. Recommended() runs
// the throttle and admission control, so wire all three, once per
// process, before the interceptors that report to them, then tell them
// which interceptors to watch for the gauges:
//
//	m, err := stormotel.New(mp) // mp: your metric.MeterProvider
//	am, err := stormotel.NewAdaptive(mp)
//	adm, err := stormotel.NewAdmission(mp)
//	sg, err := interceptor.New(append(interceptor.Recommended(),
//		interceptor.WithObserver(interceptor.Observers(m, am, adm)))...)
//	m.TrackLimiters(sg)     // stormguard.budget.ratio
//	am.TrackThrottles(sg)   // stormguard.adaptive.down, rejection_probability
//	adm.Track("payment", sg) // stormguard.admission.*, stormguard.health.serving
//
// With breakers (WithBreaker), m.TrackBreakers(set) too; New reports the
// set's changes to the observer itself.
//
// To serve Prometheus, give New an SDK MeterProvider whose reader is the
// OpenTelemetry Prometheus exporter (go.opentelemetry.io/otel/exporters/prometheus);
// the dashboard in dashboards/ uses the names that exporter produces.
//
// # Instruments
//
// Attributes follow the OpenTelemetry semantic conventions for RPC as of
// semconv v1.37.0 (the last version with these keys; v1.40.0 renamed them
// to rpc.system.name and rpc.response.status_code): rpc.system is always
// "grpc"; rpc.service and rpc.method come from the full method
// "/pkg.Service/Method" split at its last slash ("pkg.Service", "Method");
// a malformed full method is reported whole as rpc.method with no
// rpc.service; rpc.grpc.status_code is the numeric gRPC code (14 for
// UNAVAILABLE). Semantic conventions define no instruments for retries,
// so every instrument is named under the "stormguard." prefix, which also
// keeps them apart from otelgrpc's rpc.client.* and rpc.server.* if both
// are installed.
//
// "rpc.*" below means rpc.system, rpc.service and rpc.method. The Prometheus
// name column is the name the OTel Prometheus exporter (default translation,
// UnderscoreEscapingWithSuffixes) gives the series; histograms add
// _bucket, _sum and _count, and attribute keys become labels with dots
// turned into underscores (stormguard.target -> stormguard_target).
//
//	| Instrument                                 | Kind                   | Unit         | Prometheus name                            | Attributes                                     | Meaning |
//	|--------------------------------------------|------------------------|--------------|--------------------------------------------|------------------------------------------------|---------|
//	| stormguard.client.attempts                 | Int64Counter           | {attempt}    | stormguard_client_attempts_total           | rpc.*, stormguard.target, rpc.grpc.status_code | Client attempts that ended, first calls and retries alike, by code (EventAttemptEnd). |
//	| stormguard.client.attempt.duration         | Float64Histogram       | s            | stormguard_client_attempt_duration_seconds | rpc.*, stormguard.target, rpc.grpc.status_code | Duration of each client attempt (EventAttemptEnd). |
//	| stormguard.client.retries                  | Int64Counter           | {retry}      | stormguard_client_retries_total            | rpc.*, stormguard.target                       | Retries scheduled: the "granted" outcome of a retry (EventRetryScheduled). |
//	| stormguard.client.retry.refusals           | Int64Counter           | {refusal}    | stormguard_client_retry_refusals_total     | rpc.*, stormguard.target, stormguard.reason    | Retryable failures the client did not retry: the "refused" outcome, by reason (EventRetryRefused); also first attempts an open breaker or the adaptive throttle refused (breaker_open, throttled), so AdaptiveMetrics' stormguard.adaptive.refusals are a part of these, not more (but for hedges the throttle refused, which are stormguard.client.hedges' refused). |
//	| stormguard.client.retry.delay              | Float64Histogram       | s            | stormguard_client_retry_delay_seconds      | rpc.*, stormguard.target                       | Wait before each scheduled retry (backoff or server pushback). |
//	| stormguard.client.hedges                   | Int64Counter           | {hedge}      | stormguard_client_hedges_total             | rpc.*, stormguard.target, stormguard.hedge     | Hedges (interceptor.WithHedging) by stormguard.hedge: sent, won (ended the call before the attempts sent earlier, with any code: the interceptor's rule that stops hedges that lose counts only its successes), cancelled (an attempt in flight when another answered, the lead included: not a part of sent, so sent - won is not the hedges wasted), refused (due, not sent: the budget, throttle or breaker said no, or the deadline, a "do not retry", hedges that lose, a queueing target, hedges at their share of the calls) (EventHedgeSent, EventHedgeWon, EventHedgeCancelled, EventHedgeRefused). |
//	| stormguard.server.request.attempt          | Int64Histogram         | {attempt}    | stormguard_server_request_attempt          | rpc.*                                          | The caller's attempt index of each incoming request: 0 is a first call, 1 the first retry. The share above 0 is the share of load that is retries. |
//	| stormguard.server.request.depth            | Int64Histogram         | {hop}        | stormguard_server_request_depth            | rpc.*                                          | Hops from the edge of each incoming request (0: this tier is the edge). |
//	| stormguard.server.request.upstream_retries | Int64Histogram         | {retry}      | stormguard_server_request_upstream_retries | rpc.*                                          | Retries in progress above this tier for each incoming request, the caller's included; > 0 makes the default tier policy stop retrying here. |
//	| stormguard.server.pushbacks                | Int64Counter           | {pushback}   | stormguard_server_pushbacks_total          | rpc.*, rpc.grpc.status_code                    | Handlers' answers sent with the "do not retry" trailer (grpc-retry-pushback-ms: -1), by code (EventPushbackSent); admission control's refusals, which carry it too, are Admission's stormguard.admission.refusals. |
//	| stormguard.server.stacked_retries          | Int64Counter           | {request}    | stormguard_server_stacked_retries_total    | rpc.*                                          | Requests whose caller runs grpc-go's built-in retry under a retrying client interceptor, so that the attempts multiply (EventStackedRetry): a configuration to fix. |
//	| stormguard.breaker.state                   | Int64ObservableGauge   | {state}      | stormguard_breaker_state                   | stormguard.target                              | State of each breaker of the tracked sets: 0 closed, 1 half-open, 2 open (ordered by severity; not breaker.State's values). |
//	| stormguard.breaker.transitions             | Int64Counter           | {transition} | stormguard_breaker_transitions_total       | stormguard.target, stormguard.breaker.to_state | Breaker state changes, by the state entered: closed, half_open, open (EventBreakerStateChange); at most MaxTargets targets, then "_OTHER". |
//	| stormguard.budget.ratio                    | Float64ObservableGauge | 1            | stormguard_budget_ratio                    | stormguard.target                              | Retries / first attempts in the current window of each retry budget of the tracked interceptors (budget.Snapshot.Ratio). |
//	| stormguard.throttle.tokens                 | Float64ObservableGauge | {token}      | stormguard_throttle_tokens                 | stormguard.target                              | Tokens in each gRFC A6 throttle of the tracked interceptors; retries are allowed only above half of the capacity. |
//
// stormguard.reason takes these values (interceptor.StopReason):
//
//	attempts      StopAttempts      every allowed attempt was made
//	budget        StopBudget        the retry budget or throttle refused
//	breaker_open  StopBreakerOpen   the circuit breaker was open (also when it refused the first attempt)
//	tier_policy   StopTierPolicy    the tier policy allows fewer attempts (by default: a tier above is retrying)
//	pushback      StopPushback      the server answered "do not retry"
//	deadline      StopDeadline      the caller's deadline ends before the retry could start
//	throttled     StopThrottled     the adaptive throttle refused (shed, unhealthy target, or down; also the first attempt)
//	committed     StopCommitted     the call failed after it committed: response headers or a message had arrived, or a stream outgrew its replay buffer or its Context or Trailer was taken
//	not_retryable, canceled, other  not reported by the interceptors today
//
// stormguard.target is the key of the budget or breaker: the client
// connection's target, normalized so that the spellings of one address are
// one target ("dns:///payment:443", "passthrough:///payment:443" and
// "payment:443" are all "payment:443"; other schemes are kept), with the
// method appended under interceptor.WithPerMethodKeys. The client
// instruments carry it, so a platform team can see which dependency a
// service retries and is refused on; the server instruments do not (a
// server's callers are not its targets).
//
// The gauges are read from the tracked breaker sets and interceptors when
// the reader collects, not rebuilt from events: a process that restarts
// reports only the breakers it has, and a breaker the set evicted
// disappears instead of staying "open" forever. A key present in several
// tracked sets reports its most severe state, and a target in several
// tracked interceptors its highest ratio (or lowest token count). An open
// breaker reports 2 until a call arrives after its open interval and turns
// it half-open.
//
// # Cost
//
// Attribute sets are built once per method (for every code and reason) and
// kept in a copy-on-write map, so Observe allocates nothing of its own;
// with the SDK it makes no allocation per event at all (BenchmarkObserve).
// At most MaxMethods distinct methods (for client instruments: target and
// method pairs) get their own attributes; further ones are reported as
// rpc.method "_OTHER" (and stormguard.target "_OTHER"), so neither a
// caller that sprays unknown method names nor a process that dials ever
// new targets can grow the series without bound. The counters that are
// not kept per method (breaker transitions, AdaptiveMetrics' counters)
// report at most MaxTargets targets under their own names, the later
// ones as "_OTHER": a counter keeps a series for every target it ever
// saw, where the sets cap only the targets they hold at once. Each
// cache is filled first come, first served and never shrinks: a process
// whose targets churn reports its later ones as "_OTHER" (the server's
// methods have a cache of their own).
package stormotel
