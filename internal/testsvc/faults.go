package testsvc

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Capacity limits what a tier accepts; calls beyond it are shed with
// UNAVAILABLE. A zero field means no limit of that kind.
type Capacity struct {
	// PerSecond is the number of calls accepted in each wall-clock second.
	PerSecond int64
	// Concurrent is the number of calls accepted at once.
	Concurrent int64
}

// faults is the run-time fault state of one tier. Every field may change
// while calls are in flight.
type faults struct {
	down    atomic.Int32 // 0: up; otherwise the code + 1 that every call gets
	flakyP  atomic.Uint64
	latency atomic.Int64         // nanoseconds
	tailP   atomic.Uint64        // float64 bits: the share of calls that wait tail
	tail    atomic.Int64         // nanoseconds, in place of latency
	pool    atomic.Pointer[pool] // see SetPool

	capMu     sync.Mutex
	capacity  Capacity
	capSecond int64 // unix second of the per-second counter
	capCount  int64
	inflight  atomic.Int64

	rngMu sync.Mutex
	rng   *rand.Rand
}

func newFaults(seed uint64) *faults {
	return &faults{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// wait returns how long an admitted call waits before it is served: the
// latency, or for the tail's share of calls (drawn from the seeded
// source) the tail's.
func (f *faults) wait() time.Duration {
	if p := math.Float64frombits(f.tailP.Load()); p > 0 {
		f.rngMu.Lock()
		slow := f.rng.Float64() < p
		f.rngMu.Unlock()
		if slow {
			return time.Duration(f.tail.Load())
		}
	}
	return time.Duration(f.latency.Load())
}

func (f *faults) flakyProbability() float64 {
	return math.Float64frombits(f.flakyP.Load())
}

// admit decides the fate of one call. It returns a release function to
// call when the call ends (for the concurrency limit) and the error the call
// must fail with, if any. now is the time of arrival.
func (f *faults) admit(now time.Time) (release func(), err error) {
	release = func() {}
	if c := f.down.Load(); c != 0 {
		code := codes.Code(c - 1)
		return release, status.Errorf(code, "injected: tier is down (%s)", code)
	}
	f.capMu.Lock()
	limit := f.capacity
	if limit.PerSecond > 0 {
		// A late arrival stamped in an earlier second counts against the
		// current one: the counter never goes back.
		if sec := now.Unix(); sec > f.capSecond {
			f.capSecond, f.capCount = sec, 0
		}
		if f.capCount >= limit.PerSecond {
			f.capMu.Unlock()
			return release, status.Error(codes.Unavailable, "injected: over capacity (per second)")
		}
	}
	if limit.Concurrent > 0 {
		if f.inflight.Add(1) > limit.Concurrent {
			f.inflight.Add(-1)
			f.capMu.Unlock()
			return release, status.Error(codes.Unavailable, "injected: over capacity (concurrent)")
		}
		release = func() { f.inflight.Add(-1) }
	}
	if limit.PerSecond > 0 {
		f.capCount++ // only calls that passed every limit use the quota
	}
	f.capMu.Unlock()
	if p := f.flakyProbability(); p > 0 {
		f.rngMu.Lock()
		fail := f.rng.Float64() < p
		f.rngMu.Unlock()
		if fail {
			release()
			return func() {}, status.Error(codes.Unavailable, "injected: random failure")
		}
	}
	return release, nil
}

// StreamFault makes the streams that reach the last tier fail part-way
// through, to test stream retries. Zero counts mean "at once".
type StreamFault struct {
	// Code is the code of the failure; codes.OK means Unavailable.
	Code codes.Code
	// AfterRecv: a client or bidi stream fails right after it has received
	// this many requests, before answering the last of them.
	AfterRecv int
	// AfterSend: a server stream fails right after it has sent this many
	// responses; a bidi stream fails when the next request arrives after
	// it has sent this many. For bidi, AfterRecv wins when both are set.
	AfterSend int
	// Streams is the number of streams that fail, counted from
	// SetStreamFault; 0 means every stream.
	Streams int
}

type streamFault struct {
	f         StreamFault
	remaining atomic.Int64 // streams left to fail, when f.Streams > 0
}

// take returns the fault for a new stream, if it still has streams to
// fail. A stream that ends before its fault point fails nothing and counts
// for nothing: the count is taken by fire.
func (s *streamFault) take() (StreamFault, bool) {
	if s == nil || (s.f.Streams > 0 && s.remaining.Load() <= 0) {
		return StreamFault{}, false
	}
	return s.f, true
}

// fire returns the failure for a stream at its fault point, counting it;
// nil when other streams have used up the count meanwhile.
func (s *streamFault) fire() error {
	if s.f.Streams > 0 && s.remaining.Add(-1) < 0 {
		return nil
	}
	return s.f.err()
}

func (f StreamFault) err() error {
	code := f.Code
	if code == codes.OK {
		code = codes.Unavailable
	}
	return status.Errorf(code, "injected: stream failure (%s)", code)
}
