// Package incidentsim is a deterministic, in-process simulator of one tier
// (order) calling another (payment) through stormguard's client
// mechanisms, for incidents: an outage after healthy traffic, a partial
// loss, long outages, random failures, hangs, and fleets of replicas.
//
// It has no gRPC and no goroutines: a fake clock, one seeded random source
// and a queue of events drive the real budget, breaker and adaptive
// throttle the way the client interceptor does (admit, attempt, settle,
// retry decision), so an hour of traffic at a thousand requests per second
// takes well under a second and gives the same numbers every run.
package incidentsim
