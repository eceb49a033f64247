package breaker

import (
	"sync"
	"sync/atomic"
)

// A bucket counts the calls of one slice of the window. counts packs the
// calls into the low 32 bits and the failures into the high 32 bits, so
// that recording an outcome is a single atomic add. (A bucket would need
// 2^32 calls within Window/10 to overflow.)
type bucket struct {
	epoch  atomic.Int64  // index of the slice of time the counts belong to
	counts atomic.Uint64 // calls | failures<<32
	_      [48]byte      // one bucket per cache line
}

const (
	oneCall    = 1
	oneFailure = 1 | 1<<32
)

// window is a ring of buckets. Recording is lock-free; a bucket whose
// slice of time has passed is reset under the breaker's mutex, which
// happens once per bucket width at most. A clock that goes back is
// survived: time is taken as the latest bucket index seen (last), so its
// outcomes count in the newest bucket.
type window struct {
	width   int64        // nanoseconds per bucket
	last    atomic.Int64 // highest bucket index seen; never decreases
	buckets [windowBuckets]bucket
}

// index returns the bucket index of elapsed time el, never less than one
// seen before, and records it as the latest.
func (w *window) index(el int64) int64 {
	idx := el / w.width
	for {
		last := w.last.Load()
		if idx <= last {
			return last
		}
		if w.last.CompareAndSwap(last, idx) {
			return idx
		}
	}
}

// record adds one call, a failure if failed, at elapsed time el >= 0. mu
// is taken only to reset a stale bucket.
func (w *window) record(el int64, failed bool, mu *sync.Mutex) {
	idx := w.index(el)
	bk := &w.buckets[idx%windowBuckets]
	if bk.epoch.Load() < idx {
		mu.Lock()
		if bk.epoch.Load() < idx {
			// Reset first, then publish the epoch: an adder that sees
			// the new epoch adds to the reset counts.
			bk.counts.Store(0)
			bk.epoch.Store(idx)
		}
		mu.Unlock()
	}
	if failed {
		bk.counts.Add(oneFailure)
	} else {
		bk.counts.Add(oneCall)
	}
}

// sum returns the calls and failures in the window that ends at el.
func (w *window) sum(el int64) (calls, failures int64) {
	hi := w.index(el)
	for i := range w.buckets {
		bk := &w.buckets[i]
		if bk.epoch.Load() > hi-windowBuckets {
			c := bk.counts.Load()
			calls += int64(c & (1<<32 - 1))
			failures += int64(c >> 32)
		}
	}
	return calls, failures
}

// reset forgets all counts.
func (w *window) reset() {
	for i := range w.buckets {
		w.buckets[i].counts.Store(0)
	}
}
