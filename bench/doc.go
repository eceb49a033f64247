// Package bench compares stormguard with the retry stacks users would
// otherwise pick, on the gateway -> order -> payment chain of
// internal/testsvc: fault scenarios (cmd/scenarios) and happy-path overhead
// (the benchmarks of this package).
//
// It is a module of its own, so that go-grpc-middleware's, grpc-go's and
// failsafe-go's retry stacks never enter the library's go.mod. Its module
// path lies inside the root module's path, so Go's internal rule (which
// compares import paths) lets it use the root's internal/testsvc chain.
package bench
