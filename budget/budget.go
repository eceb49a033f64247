package budget

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

// Defaults for the zero fields of [Config].
const (
	DefaultRatio               = 0.2
	DefaultWindow              = 10 * time.Second
	DefaultMinRetriesPerSecond = 10.0

	// MinWindow and MaxWindow bound Config.Window.
	MinWindow = time.Second
	MaxWindow = 10 * time.Minute

	// MaxMinRetriesPerSecond bounds Config.MinRetriesPerSecond. A floor
	// of a billion retries a second is no limit at all in practice; the
	// bound keeps the floor, counted in millionths over the longest
	// window, far inside an int64.
	MaxMinRetriesPerSecond = 1e9
)

// numBuckets is the number of time buckets the window is divided into.
const numBuckets = 10

// ErrInvalidConfig is wrapped by every error New and NewThrottle return.
// Check it with errors.Is.
var ErrInvalidConfig = errors.New("budget: invalid config")

// Clock tells the time. Nil in Config means the system clock (time.Now).
// Durations are taken as Now().Sub(start), so a clock whose readings carry
// Go's monotonic component (time.Now's do) is immune to wall-clock jumps.
// Implementations must be safe for concurrent use.
//
// To test code that uses a Budget without waiting for real time, write a
// fake: a struct with a mutex and a time.Time whose Now returns the time
// and whose Advance moves it (see the Clock example). A fake that goes
// back is allowed: the Budget treats it as standing still.
type Clock interface {
	Now() time.Time
}

// Config configures a [Budget]. The zero value of every field means its
// default, so Config{} is a valid configuration.
type Config struct {
	// Ratio is the largest share of retries relative to first attempts in
	// the window: 0.2 means 1 retry per 5 requests. Zero means
	// DefaultRatio (0.2), not "no retries": Ratio cannot be set to zero.
	// Valid: 0 < Ratio <= 1, or zero for the default. It is rounded to six
	// decimal places.
	Ratio float64

	// Window is the length of the sliding window. Zero means
	// DefaultWindow (10s). Valid: MinWindow (1s) <= Window <= MaxWindow
	// (10min).
	Window time.Duration

	// MinRetriesPerSecond is the floor that lets a quiet client retry: the
	// window always allows MinRetriesPerSecond x Window.Seconds() retries
	// on top of the ratio. Zero means DefaultMinRetriesPerSecond (10); set
	// NoFloor for a floor of zero. Valid: 0 <= MinRetriesPerSecond <=
	// MaxMinRetriesPerSecond (1e9), not NaN. It is rounded, like Ratio, so
	// that the floor per window is a whole number of millionths.
	MinRetriesPerSecond float64

	// NoFloor sets the floor to zero, so retries are allowed only by the
	// ratio: a client with no requests in the window cannot retry at all.
	// MinRetriesPerSecond must then be zero.
	NoFloor bool

	// Clock is the time source. Nil means the system clock, which is then
	// read with time.Since: one monotonic clock read per call.
	Clock Clock
}

// Budget limits retries to a share of requests over a sliding window, with
// a floor for low traffic: the semantics of Linkerd's and Finagle's retry
// budgets. A retry is granted if and only if
//
//	retries_in_window < Ratio*requests_in_window + MinRetriesPerSecond*Window.Seconds()
//
// and a granted retry is counted at once. So right after any grant, the
// window holds at most ceil(Ratio*requests + floor) retries: with the
// defaults, 20 % of the requests plus 100. Callers record first attempts
// with RecordRequest and ask TryRetry before each retry.
//
// The window is a ring of 10 buckets, each Window/10 long, with an atomic
// counter of requests and one of retries per bucket, each tagged with the
// bucket's epoch so that a bucket left over from an earlier turn of the
// ring counts as zero. Every method is O(1), lock-free and allocation-free;
// TryRetry decides and records in one compare-and-swap, so concurrent
// callers cannot all pass on the same count.
//
// Precision. The window slides in steps of Window/10: a call sees the
// requests and retries of the current bucket and the 9 before it, so an
// event stops counting between 0.9 x Window and Window after it was
// recorded. When calls do not overlap, every decision is exact for that
// window: it is made in integer millionths, with Ratio and the floor
// rounded to six decimal places (so 0.07 x 100 allows 7 retries, not the 8
// that float64's 7.000000000000001 would). Requests expire before the retries they allowed, so a later
// window can hold more retries than its own requests allow; what holds for
// every 10 consecutive buckets is retries <= ceil(Ratio x requests + floor)
// with requests counted over those buckets and the 9 before them. Under
// concurrent use, a caller whose TryRetry straddles the start of a new
// bucket decides on the bucket it started in and does not see retries
// granted in the new one, so a window can exceed the bound by one retry per
// such caller: at most the number of goroutines inside TryRetry when the
// bucket turns.
//
// Time. Durations are measured as Clock.Now().Sub(start) from New, so wall
// clock jumps do not matter for the system clock. A clock that goes back is
// treated as standing still at the latest time seen by any method: nothing
// expires until it catches up, and no count is lost. After an idle period
// of a full window or more every bucket is stale, so a burst sees an empty
// window (only the floor). Epoch tags are 32 bits wide: a bucket untouched
// for within 10 bucket lengths of 2^32 of them (13.6 years at the smallest
// window) would be mistaken for a live one.
//
// A Budget must be created with New; the zero Budget is not usable.
type Budget struct {
	clk   Clock
	sys   bool // clk is the system clock: use time.Since, one clock read
	start time.Time
	width int64 // bucket length in nanoseconds
	// The decision is made in integers, in millionths, so that it is
	// exact: ratio x requests + floor, with ratio and floor rounded to six
	// decimal places.
	ratioPPM int64  // Config.Ratio after defaults, x 1e6
	floorPPM int64  // retries the floor allows per window, x 1e6
	cfg      Config // the resolved config, for Config()

	_    [64]byte
	last atomic.Int64 // highest bucket index seen; never decreases
	_    [56]byte

	granted atomic.Int64
	refused atomic.Int64
	_       [48]byte

	buckets [numBuckets]bucket
}

// bucket holds two words, each epoch<<32 | count, for one slot of the ring.
type bucket struct {
	requests atomic.Uint64
	retries  atomic.Uint64
}

const countMask = 1<<32 - 1

// New returns a Budget for cfg, or an error wrapping ErrInvalidConfig that
// names the offending field.
func New(cfg Config) (*Budget, error) {
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	b := &Budget{
		clk:      cfg.Clock,
		width:    int64(cfg.Window / numBuckets),
		ratioPPM: int64(math.Round(cfg.Ratio * 1e6)),
		floorPPM: int64(math.Round(cfg.MinRetriesPerSecond * cfg.Window.Seconds() * 1e6)),
		cfg:      cfg,
	}
	_, b.sys = b.clk.(clock.Real)
	b.start = b.clk.Now()
	return b, nil
}

// resolve validates c and fills in defaults.
func (c *Config) resolve() error {
	switch {
	case math.IsNaN(c.Ratio) || c.Ratio < 0 || c.Ratio > 1:
		return fmt.Errorf("%w: Ratio %v out of range (0, 1] (0 means the default, %v)", ErrInvalidConfig, c.Ratio, DefaultRatio)
	case c.Window != 0 && (c.Window < MinWindow || c.Window > MaxWindow):
		return fmt.Errorf("%w: Window %v out of range [%v, %v]", ErrInvalidConfig, c.Window, MinWindow, MaxWindow)
	case math.IsNaN(c.MinRetriesPerSecond) || c.MinRetriesPerSecond < 0 || c.MinRetriesPerSecond > MaxMinRetriesPerSecond:
		// !(x <= max) also catches +Inf; NaN fails every comparison.
		return fmt.Errorf("%w: MinRetriesPerSecond %v out of range [0, %g] (use NoFloor for no floor)",
			ErrInvalidConfig, c.MinRetriesPerSecond, float64(MaxMinRetriesPerSecond))
	case c.NoFloor && c.MinRetriesPerSecond != 0:
		return fmt.Errorf("%w: MinRetriesPerSecond %v must be 0 when NoFloor is set", ErrInvalidConfig, c.MinRetriesPerSecond)
	}
	if c.Ratio == 0 {
		c.Ratio = DefaultRatio
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.MinRetriesPerSecond == 0 && !c.NoFloor {
		c.MinRetriesPerSecond = DefaultMinRetriesPerSecond
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return nil
}

// Config returns the configuration in use, with defaults filled in.
func (b *Budget) Config() Config { return b.cfg }

// RecordRequest records a first attempt. Retries are recorded by TryRetry,
// not here.
func (b *Budget) RecordRequest() {
	idx := b.index()
	for {
		slot := &b.buckets[idx%numBuckets].requests
		w := slot.Load()
		next, ok := b.increment(w, &idx)
		if !ok {
			continue // idx was refreshed
		}
		if slot.CompareAndSwap(w, next) {
			return
		}
		idx = max(idx, b.last.Load())
	}
}

// TryRetry reports whether a retry may be sent now and, if so, records it.
func (b *Budget) TryRetry() bool {
	idx := b.index()
	for {
		slot := &b.buckets[idx%numBuckets].retries
		w := slot.Load()
		next, ok := b.increment(w, &idx)
		if !ok {
			continue
		}
		// next carries the count of the current bucket including this
		// retry; the other nine buckets are read as they are.
		requests, retries := b.sums(idx, true)
		retries += int64(next&countMask) - 1
		if retries*1e6 >= b.ratioPPM*requests+b.floorPPM {
			b.refused.Add(1)
			return false
		}
		if slot.CompareAndSwap(w, next) {
			b.granted.Add(1)
			return true
		}
		// Another retry was granted or the bucket rotated: decide again.
		idx = max(idx, b.last.Load())
	}
}

// RecordOutcome does nothing: a Budget limits retries by volume, not by
// outcome. It is there to satisfy Limiter.
func (b *Budget) RecordOutcome(success bool) {}

// Snapshot returns the counters of the current window and the totals. It
// never blocks callers; like every method, it reads the clock, and that
// reading counts as the latest time seen.
func (b *Budget) Snapshot() Snapshot {
	idx := b.index()
	requests, retries := b.sums(idx, false)
	s := Snapshot{
		Requests: requests,
		Retries:  retries,
		Granted:  b.granted.Load(),
		Refused:  b.refused.Load(),
	}
	if requests > 0 {
		s.Ratio = float64(retries) / float64(requests)
	}
	return s
}

// index returns the bucket index of now, never less than one seen before,
// and records it as the latest.
func (b *Budget) index() int64 {
	var elapsed time.Duration
	if b.sys {
		// The same monotonic duration as Now().Sub(start), for half the
		// cost: time.Now also reads the wall clock.
		elapsed = time.Since(b.start)
	} else {
		elapsed = b.clk.Now().Sub(b.start)
	}
	idx := int64(elapsed) / b.width
	last := b.last.Load()
	for idx > last {
		if b.last.CompareAndSwap(last, idx) {
			return idx
		}
		last = b.last.Load()
	}
	return last
}

// increment returns w plus one at epoch *idx. If w belongs to a newer
// bucket than *idx (the caller was delayed a full turn of the ring), it
// moves *idx forward and returns false so the caller reloads the slot.
func (b *Budget) increment(w uint64, idx *int64) (uint64, bool) {
	epoch := uint32(*idx)
	count := w & countMask
	switch d := int32(epoch - uint32(w>>32)); {
	case count == 0 || d > 0:
		// Empty or stale: start the bucket afresh at this epoch.
		return uint64(epoch)<<32 | 1, true
	case d < 0:
		if last := b.last.Load(); last > *idx {
			*idx = last
			return 0, false
		}
		// Not newer than the latest index: a tag from 2^31 or more
		// buckets ago that wrapped around. Stale.
		return uint64(epoch)<<32 | 1, true
	case count == countMask:
		return w, true // saturated; cannot happen below 2^32 per bucket
	default:
		return w + 1, true
	}
}

// sums returns the requests and retries of the window ending at bucket idx.
// If skipRetriesOfCurrent is set, the retries of bucket idx are left out.
func (b *Budget) sums(idx int64, skipRetriesOfCurrent bool) (requests, retries int64) {
	epoch := uint32(idx)
	skip := -1
	if skipRetriesOfCurrent {
		skip = int(idx % numBuckets)
	}
	for i := range b.buckets {
		bk := &b.buckets[i]
		requests += live(bk.requests.Load(), epoch)
		if i == skip {
			continue
		}
		retries += live(bk.retries.Load(), epoch)
	}
	return requests, retries
}

// live returns the count of w if its epoch lies in the window ending at
// epoch, else zero.
func live(w uint64, epoch uint32) int64 {
	if d := epoch - uint32(w>>32); d < numBuckets {
		return int64(w & countMask)
	}
	return 0
}
