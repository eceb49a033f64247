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
// at least 100 calls in 10 s) tells a sick target from a noisy one: at a
// steady 30 % the window's rate stays far below the threshold (at 1000
// calls/s it holds some 10,000 calls), and a target that is really down
// still trips the breaker after exactly MinimumCalls calls.
//
// The volume in the window is the limit of this protection: a rate over
// few calls is noisy, hence the default MinimumCalls of 100. At 20, with
// 30 % random failures, 10 or more of 20 calls fail 4.8 % of the time, and
// about 6 % of fresh breakers opened within their first calls; at 100, 50 %
// is 4.4 standard deviations above 30 %, and none of 6,000 simulated fresh
// breakers opened. The trade-off has two sides. A target that is down
// opens the breaker only after 100 failed calls. And a client whose window
// holds fewer than MinimumCalls calls (under 10 calls a second with the
// default 10 s Window) never opens the breaker on the rate, not even for a
// dead target; near that edge the rate is noisy again (in our simulation,
// at 30 % and 10 calls a second, 2 % of breakers opened within an hour;
// at 20 calls a second none of 1,000). For such clients set
// ConsecutiveFailures, an additional trigger, or lower MinimumCalls and
// accept the noise.
//
// # Use
//
// Call Breaker.Allow before each call and Permit.Done with the outcome
// after it. Allow never blocks; when the breaker is open it returns ErrOpen
// and the caller should fail fast without retrying. Set hands out one
// Breaker per key (for example the target, or target and method).
package breaker
