// Package breaker is a failure-rate circuit breaker for calls to one target,
// and a bounded set of breakers keyed by target.
//
// # Why a failure rate over a window
//
// A breaker that opens after N consecutive failures mistakes bad luck for an
// outage. With 30 % of calls failing at random, five failures in a row are
// a matter of seconds at any real call rate (0.3^5 is about 1 in 400), so a
// 5-consecutive-failures breaker opens again and again; in our measurement
// it failed about 98 % of users, although 70 % of calls would have
// succeeded. A failure rate over a sliding time window (by default 50 % of
// at least 20 calls in 10 s) tells a sick target from a noisy one: at a
// steady 30 % the window's rate stays far below the threshold (at 1000
// calls/s it holds some 10,000 calls), and a target that is really down
// still trips the breaker after exactly MinimumCalls calls.
//
// The volume in the window is the limit of this protection: a rate over
// few calls is noisy. With 30 % random failures, 10 or more of 20 calls
// fail 4.8 % of the time, so about 6 % of fresh breakers open within their
// first few dozen calls; and in our simulation a target called 5 times a
// second (about 50 calls in the window) at 30 % opens within the hour,
// at 10 calls a second one breaker in seven does. Raise MinimumCalls (and
// Window) for such targets: at MinimumCalls 100, none of 6,000 simulated
// fresh breakers at 30 % opened. Consecutive failures remain available as
// an additional trigger (Config.ConsecutiveFailures).
//
// # Use
//
// Call Breaker.Allow before each call and Permit.Done with the outcome
// after it. Allow never blocks; when the breaker is open it returns ErrOpen
// and the caller should fail fast without retrying. Set hands out one
// Breaker per key (for example the target, or target and method).
package breaker
