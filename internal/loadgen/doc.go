// Package loadgen drives an in-process chain (internal/testsvc) with user
// requests, closed-loop or open-loop, and records what each user saw. It
// is shared by the benchmarks (module bench) and the demo (cmd/stormsim),
// so that both measure incidents the same way.
package loadgen
