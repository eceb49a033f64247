package bench

import (
	"time"

	"github.com/stormguard/stormguard/internal/loadgen"
	"github.com/stormguard/stormguard/internal/testsvc"
)

// The load generators live in internal/loadgen, shared with cmd/stormsim.

// Sample is one user request: when it started (since the start of the
// load), how long the user waited, and the code the user got.
type Sample = loadgen.Sample

// Samples is what the users of one load saw.
type Samples = loadgen.Samples

type collector = loadgen.Collector

func newCollector() *collector { return loadgen.NewCollector() }

// ClosedLoop runs users goroutines that each send one request after the
// other, every request with the given deadline, until n requests have
// started (n > 0) or, for n == 0, until stop is closed. It returns when
// every request has ended.
func ClosedLoop(c *testsvc.Chain, users, n int, deadline time.Duration, stop <-chan struct{}) Samples {
	return loadgen.ClosedLoop(c, users, n, deadline, stop)
}

func closedLoop(col *collector, c *testsvc.Chain, users, n int, deadline time.Duration, stop <-chan struct{}) Samples {
	return loadgen.ClosedLoopInto(col, c, users, n, deadline, stop)
}

// OpenLoop sends requests at a fixed rate, each in its own goroutine with
// the given deadline, whatever the chain does: arrivals do not wait for
// answers. phase is called at every tick with the time since the start and
// may change faults; the load ends after total. It returns when every
// request has ended.
func OpenLoop(c *testsvc.Chain, perSecond int, total, deadline time.Duration, phase func(elapsed time.Duration)) Samples {
	return loadgen.OpenLoop(c, perSecond, total, deadline, phase)
}
