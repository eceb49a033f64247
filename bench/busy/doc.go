// Package busy is the load-test harness of issue 19 ("busy is not
// broken"), measured as users measure: the gateway -> order -> payment
// chain with every tier its own OS process over loopback TCP
// (cmd/tier), driven by ghz at a fixed concurrency and by an open-loop
// generator of our own, with retries off and the peer stacks in the same
// run, each figure the median of interleaved runs (cmd/busy).
//
// A tier's work per request (CPU, waiting, a worker pool, failures) runs
// behind every interceptor of its stack, where a real handler's would,
// so that stormguard's server side sees it; its counts of stormguard's
// refusals and "down" events come from an interceptor.Observer and are
// served as JSON on a loopback HTTP port.
package busy
