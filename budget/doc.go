// Package budget limits retries so that they cannot multiply load into a
// retry storm: a sliding-window retry budget and a gRFC A6 token-bucket throttle.
//
// Why a budget: when every tier of a call chain retries three times, one
// failed user request becomes 3 x 3 x 3 = 27 calls at the deepest service,
// and backoff only spreads them over time. A budget caps retries at a
// fraction of the traffic a client actually sends (by default 20 % over ten
// seconds, plus a small floor so that a quiet client can still retry), so
// under sustained failure each tier sends about 1.2 calls per request instead
// of 3, whatever the depth. How to choose: use [Budget] (Linkerd/Finagle
// semantics) when you want a load bound you can state in requests per
// second: "retries add at most Ratio to what we send". Use [Throttle] (the
// algorithm grpc-go applies when a service config sets retryThrottling) when
// you want retries to stop while the target's failure rate is high and
// resume as successes come back; it reacts to outcomes, not to volume, and
// needs no clock. Both implement [Limiter], which the interceptors consume.
package budget
