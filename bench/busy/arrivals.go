package busy

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Arrivals are the unary calls of the test service that reached a tier
// process, per bucket of its clock: Counts[i] arrived in [Start +
// i*Bucket, Start + (i+1)*Bucket). Start is the wall clock (the same
// for every process of the machine, so that a harness can lay the
// series over its load's time line); the buckets follow the process's
// monotonic clock from it. The JSON of the tier's GET /arrivals.
type Arrivals struct {
	Start  time.Time     `json:"start"`
	Bucket time.Duration `json:"bucket_ns"`
	// Counts ends at the last bucket with an arrival.
	Counts []int64 `json:"counts"`
	// Late: arrivals after the last bucket the tier keeps
	// (arrivalsKept after its start), not in Counts.
	Late int64 `json:"late,omitempty"`
}

// In returns the arrivals in [t0+from, t0+to): the buckets whose start
// lies in it.
func (a Arrivals) In(t0 time.Time, from, to time.Duration) int64 {
	if a.Bucket <= 0 {
		return 0
	}
	off := a.Start.Sub(t0) // where bucket 0 starts on the caller's time line
	first := max(0, ceilDiv(from-off, a.Bucket))
	var n int64
	for i := first; i < int64(len(a.Counts)); i++ {
		if off+time.Duration(i)*a.Bucket >= to {
			break
		}
		n += a.Counts[i]
	}
	return n
}

// ceilDiv returns d/b rounded up (b > 0).
func ceilDiv(d, b time.Duration) int64 {
	q := int64(d / b)
	if d%b > 0 {
		q++
	}
	return q
}

// arrivalBucket and arrivalsKept size a tier's series: 1 ms buckets
// (a slice boundary is off by less than a bucket), for the first two
// minutes of the process (a harness run is seconds long).
const (
	arrivalBucket = time.Millisecond
	arrivalsKept  = 2 * time.Minute
)

// arrivals counts a tier's arrivals per bucket since start.
type arrivals struct {
	start  time.Time
	counts []atomic.Int64
	late   atomic.Int64
}

func newArrivals() *arrivals {
	return &arrivals{start: time.Now(), counts: make([]atomic.Int64, arrivalsKept/arrivalBucket)}
}

// add counts an arrival at since after start.
func (a *arrivals) add(since time.Duration) {
	i := since / arrivalBucket
	if since < 0 || i >= time.Duration(len(a.counts)) {
		a.late.Add(1)
		return
	}
	a.counts[i].Add(1)
}

// unary is the tier's outermost server interceptor: it counts the test
// service's unary calls as they arrive, before any other interceptor.
func (a *arrivals) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if info.FullMethod == testsvcv1.TestService_Unary_FullMethodName {
		a.add(time.Since(a.start))
	}
	return h(ctx, req)
}

// snapshot returns the series so far.
func (a *arrivals) snapshot() Arrivals {
	last := -1
	c := make([]int64, len(a.counts))
	for i := range a.counts {
		if c[i] = a.counts[i].Load(); c[i] != 0 {
			last = i
		}
	}
	return Arrivals{Start: a.start.Round(0), Bucket: arrivalBucket, Counts: c[:last+1], Late: a.late.Load()}
}
