package hedge

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

// Defaults used for zero Config fields.
const (
	DefaultPercentile = 0.95
	DefaultWindow     = 10 * time.Second
	DefaultMinSamples = 100
	DefaultInitial    = 50 * time.Millisecond

	// MinWindow and MaxWindow bound Config.Window.
	MinWindow = time.Second
	MaxWindow = 10 * time.Minute
)

// ErrInvalidConfig is wrapped by every error New returns for a bad
// Config; the message names the field.
var ErrInvalidConfig = errors.New("hedge: invalid config")

// Config configures a Delay. The zero value is a usable configuration
// with the defaults listed on each field.
type Config struct {
	// Percentile of the target's recent latencies that the delay is, in
	// (0, 1): a request whose answer has not come after it is hedged, so
	// about 1 - Percentile of the requests are, whatever the latencies.
	// Zero means DefaultPercentile (0.95): 5 % of requests hedged, within
	// a retry budget of 20 %. Finagle's BackupRequestFilter takes the
	// percentile from the extra load it may add, the same way.
	Percentile float64

	// Window: latencies are kept for between Window/2 and Window (two
	// halves; the older is dropped as the next begins), so that the delay
	// follows a target whose latency changes. Zero means DefaultWindow
	// (10 s). Valid: MinWindow (1 s) to MaxWindow (10 min).
	Window time.Duration

	// MinSamples latencies in the window at least make the delay their
	// percentile; with fewer it is Initial. Zero means DefaultMinSamples
	// (100): the 95th of 100 latencies lies between the true 90th and
	// 97.5th percentile nine times in ten, so that 2.5 % to 10 % of the
	// requests are hedged, not many more. A client slower than
	// MinSamples per Window keeps Initial.
	MinSamples int

	// Initial is the delay before MinSamples latencies came. Zero means
	// DefaultInitial (50 ms). Valid: positive.
	Initial time.Duration

	// Min and Max bound the delay (Max zero: no bound). Valid: Min >= 0,
	// Max zero or >= Min.
	Min, Max time.Duration

	// Clock is the time source. It must be safe for concurrent use. Nil
	// means the system clock.
	Clock interface{ Now() time.Time }
}

func (c Config) normalize() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if c.Percentile == 0 {
		c.Percentile = DefaultPercentile
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.MinSamples == 0 {
		c.MinSamples = DefaultMinSamples
	}
	if c.Initial == 0 {
		c.Initial = DefaultInitial
	}
	switch {
	case !(c.Percentile > 0 && c.Percentile < 1):
		return bad("Percentile %v: want (0, 1)", c.Percentile)
	case c.Window < MinWindow || c.Window > MaxWindow:
		return bad("Window %v: want %v to %v", c.Window, MinWindow, MaxWindow)
	case c.MinSamples < 1:
		return bad("MinSamples %d: want >= 1", c.MinSamples)
	case c.Initial < 0:
		return bad("Initial %v: want positive", c.Initial)
	case c.Min < 0:
		return bad("Min %v: want >= 0", c.Min)
	case c.Max != 0 && c.Max < c.Min:
		return bad("Max %v: want zero or >= Min (%v)", c.Max, c.Min)
	}
	return c, nil
}

// The histogram: latencies from 2^minOctave ns (1 µs) up, each power of
// two split into subBuckets, so that a bucket's bounds are at most 1/16
// (6 %) apart; below 1 µs is the first bucket, from 2^maxOctave ns (about
// 18 minutes) on the last.
const (
	subBits    = 4
	subBuckets = 1 << subBits
	minOctave  = 10
	maxOctave  = 40
	numBuckets = (maxOctave - minOctave) * subBuckets
)

// bucketOf returns the bucket of a latency of ns nanoseconds.
func bucketOf(ns int64) int {
	if ns < 1<<minOctave {
		return 0
	}
	o := bits.Len64(uint64(ns)) - 1 // 2^o <= ns < 2^(o+1)
	if o >= maxOctave {
		return numBuckets - 1
	}
	sub := int(ns>>(o-subBits)) & (subBuckets - 1)
	return (o-minOctave)*subBuckets + sub
}

// upper returns the upper bound, in nanoseconds, of bucket i: the delay a
// percentile that falls in it reads as (a hedge a little late rather
// than early).
func upper(i int) int64 {
	o, sub := i/subBuckets+minOctave, int64(i%subBuckets)
	return 1<<o + (sub+1)<<(o-subBits)
}

// half is one half of the window: a count per bucket.
type half struct {
	n      atomic.Int64
	counts [numBuckets]atomic.Int64
}

// Delay keeps one target's recent latencies and gives the hedge delay:
// their Percentile, or Initial until MinSamples came. Create one with
// New; it is safe for concurrent use. Record is a few atomic adds, Get
// an atomic load; the percentile is recomputed at most every Window/20.
// Nothing runs in the background.
type Delay struct {
	cfg   Config
	clk   interface{ Now() time.Time }
	start time.Time

	cur    atomic.Pointer[half] // the half that Record adds to
	ends   atomic.Int64         // elapsed: when cur's half ends; written under mu
	delay  atomic.Int64         // nanoseconds: the last delay computed
	nextAt atomic.Int64         // elapsed: when Get recomputes it
	// median is the window's median (ns) at the last computation, floor
	// the lowest median seen lately (see Queueing); 0 before MinSamples.
	// recent is the lower quartile of the latencies recorded since the
	// computation before (0: too few of them).
	median, floor, recent atomic.Int64
	// initial: the delay is Initial, for want of MinSamples: the Record
	// that brings the current half to MinSamples makes the next Get
	// recompute it, not the next Window/20.
	initial atomic.Bool

	mu     sync.Mutex // guards at and the switch of halves, and last
	halves [2]half
	at     int // index of cur in halves
	// last: each half's counts per bucket at the last computation, to
	// tell the latencies recorded since (see recentQuartile); a half
	// emptied starts again from zero.
	last [2][numBuckets]int64
}

// New returns a Delay, or an error wrapping ErrInvalidConfig when a
// field of cfg is invalid.
func New(cfg Config) (*Delay, error) {
	c, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	d := &Delay{cfg: c, clk: c.Clock}
	if d.clk == nil {
		d.clk = clock.Real{}
	}
	d.start = d.clk.Now()
	d.cur.Store(&d.halves[0])
	d.ends.Store(int64(c.Window / 2))
	d.delay.Store(int64(d.bound(c.Initial)))
	d.initial.Store(true)
	return d, nil
}

// elapsed returns the nanoseconds since New, never negative.
func (d *Delay) elapsed() int64 { return max(int64(d.clk.Now().Sub(d.start)), 0) }

// Record adds the latency of an answer that came. Negative latencies
// are ignored.
func (d *Delay) Record(latency time.Duration) {
	if latency < 0 {
		return
	}
	d.turn(d.elapsed())
	h := d.cur.Load()
	h.counts[bucketOf(int64(latency))].Add(1)
	if n := h.n.Add(1); n == int64(d.cfg.MinSamples) && d.initial.Load() {
		d.nextAt.Store(0)
	}
}

// turn starts the next half when the current one has ended: the older
// half is emptied and becomes the current one. Latencies recorded into
// it while it is emptied may be lost or kept: a few, once per half.
func (d *Delay) turn(el int64) {
	if el < d.ends.Load() {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	halfLen := int64(d.cfg.Window / 2)
	for turns := 0; el >= d.ends.Load() && turns < 2; turns++ {
		d.at = 1 - d.at
		h := &d.halves[d.at]
		for i := range h.counts {
			h.counts[i].Store(0)
		}
		h.n.Store(0)
		d.last[d.at] = [numBuckets]int64{}
		d.cur.Store(h)
		d.ends.Add(halfLen)
	}
	if e := d.ends.Load(); el >= e {
		// Idle for a window or more: both halves are empty now.
		d.ends.Store(el + halfLen)
	}
	d.nextAt.Store(0) // recompute on the next Get
}

// Get returns the delay after which a request still unanswered is
// hedged: the Percentile of the window's latencies, bounded by Min and
// Max, or Initial while the window holds fewer than MinSamples.
func (d *Delay) Get() time.Duration {
	el := d.elapsed()
	if next := d.nextAt.Load(); el >= next && d.nextAt.CompareAndSwap(next, el+int64(d.cfg.Window/20)) {
		d.turn(el)
		d.delay.Store(int64(d.compute()))
	}
	return time.Duration(d.delay.Load())
}

// compute returns the delay from the two halves' counts, and updates
// the median and its floor (see Queueing).
func (d *Delay) compute() time.Duration {
	a, b := &d.halves[0], &d.halves[1]
	n := a.n.Load() + b.n.Load()
	d.initial.Store(n < int64(d.cfg.MinSamples))
	if n < int64(d.cfg.MinSamples) {
		d.median.Store(0) // too few to say: not queueing
		d.recent.Store(0)
		return d.bound(d.cfg.Initial)
	}
	// The smallest latencies with at least half, and at least Percentile,
	// of the samples at or below them.
	half, rank := (n+1)/2, int64(math.Ceil(d.cfg.Percentile*float64(n)))
	var seen, med, at int64
	for i := range numBuckets {
		seen += a.counts[i].Load() + b.counts[i].Load()
		if med == 0 && seen >= half {
			med = upper(i)
		}
		if at == 0 && seen >= rank {
			at = upper(i)
		}
		if med != 0 && at != 0 {
			break
		}
	}
	if med == 0 || at == 0 { // counts moved while read: the last bucket
		med, at = max(med, upper(numBuckets-1)), max(at, upper(numBuckets-1))
	}
	d.setMedian(med)
	d.recent.Store(d.recentQuartile())
	return d.bound(time.Duration(at))
}

// minRecent latencies recorded since the last computation at least make
// their lower quartile count (see Queueing).
const minRecent = 20

// recentQuartile returns the lower quartile of the latencies recorded
// since the last computation, or 0 when fewer than minRecent came; it
// keeps the counts for the next one. A quartile, not the median: a queue
// slows every request, the fast quarter too, while the median of a few
// dozen latencies of a steady target with a slow mode (cache misses)
// lands on that mode often.
func (d *Delay) recentQuartile() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var diff [numBuckets]int64
	var n int64
	for h := range d.halves {
		for i := range numBuckets {
			c := d.halves[h].counts[i].Load()
			k := max(c-d.last[h][i], 0)
			diff[i] += k
			n += k
			d.last[h][i] = c
		}
	}
	if n < minRecent {
		return 0
	}
	var seen int64
	for i := range numBuckets {
		if seen += diff[i]; seen >= (n+3)/4 {
			return upper(i)
		}
	}
	return 0
}

// floorRise is how slowly the floor of the median follows a median
// above it: by 1/floorRise of the gap at each computation (every
// Window/20), so that a target whose latency rose for good (a slower
// dependency) stops reading as queueing after some 20 s to a minute,
// while a load that drives its queue up reads as queueing at once.
const floorRise = 64

func (d *Delay) setMedian(med int64) {
	d.median.Store(med)
	switch fl := d.floor.Load(); {
	case fl == 0 || med < fl:
		d.floor.Store(med)
	default:
		d.floor.Store(fl + (med-fl)/floorRise)
	}
}

// Queueing reports whether the target's recent median latency is more
// than twice the lowest median it had lately: it spends its time in a
// queue (at capacity from a fixed number of callers, or overloaded), not
// in a slow tail, and a hedge would only add to the queue. The recent
// median is the window's, or the lower quartile of the latencies recorded
// since the computation before (Window/20 earlier, if 20 or more came),
// whichever is higher: a queue that builds, and slows every request,
// reads as queueing within a computation or two, not once its latencies
// make up half of the window (a user's trial: 5 s). It is false until
// MinSamples latencies came, and is as recent as the last Get.
func (d *Delay) Queueing() bool {
	fl := d.floor.Load()
	return fl > 0 && max(d.median.Load(), d.recent.Load()) > 2*fl
}

// bound applies Min and Max.
func (d *Delay) bound(v time.Duration) time.Duration {
	v = max(v, d.cfg.Min)
	if d.cfg.Max > 0 {
		v = min(v, d.cfg.Max)
	}
	return v
}
