package hedge

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

const ms = time.Millisecond

func newTest(t *testing.T, cfg Config) (*Delay, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg.Clock = clk
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d, clk
}

func TestNewInvalid(t *testing.T) {
	for _, cfg := range []Config{
		{Percentile: -0.1}, {Percentile: 1}, {Percentile: 1.5},
		{Window: 500 * ms}, {Window: time.Hour},
		{MinSamples: -1},
		{Initial: -ms},
		{Min: -ms},
		{Min: 10 * ms, Max: 5 * ms},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v): got %v, want ErrInvalidConfig", cfg, err)
		}
	}
	if _, err := New(Config{}); err != nil {
		t.Fatalf("New(Config{}): %v", err)
	}
}

// Every latency falls in a bucket whose bounds are at most 1/16 apart
// (relative to the lower), the buckets follow the latencies in order,
// and a percentile reads as its bucket's upper bound, never below the
// latency.
func TestBuckets(t *testing.T) {
	prev := 0
	for ns := int64(1); ns < 1<<42; ns += max(ns/37, 1) {
		i := bucketOf(ns)
		if i < prev {
			t.Fatalf("bucketOf(%d) = %d, below bucketOf of a smaller latency (%d)", ns, i, prev)
		}
		prev = i
		if i < 0 || i >= numBuckets {
			t.Fatalf("bucketOf(%d) = %d, out of range", ns, i)
		}
		if ns >= 1<<minOctave && ns < 1<<maxOctave {
			if up := upper(i); up <= ns || float64(up-ns) > float64(ns)/16 {
				t.Fatalf("latency %d ns: bucket %d's upper bound %d", ns, i, up)
			}
		}
	}
}

// Initial until MinSamples latencies came, then their percentile.
func TestInitialUntilMinSamples(t *testing.T) {
	d, clk := newTest(t, Config{Initial: 40 * ms})
	for range DefaultMinSamples - 1 {
		d.Record(10 * ms)
	}
	if got := d.Get(); got != 40*ms {
		t.Fatalf("after %d latencies: %v, want Initial 40ms", DefaultMinSamples-1, got)
	}
	// The latency that makes MinSamples counts at once, not Window/20
	// later, when the delay is recomputed otherwise: hedges at Initial
	// for longer cost the first second's tail.
	d.Record(10 * ms)
	if got := d.Get(); got < 10*ms || got > 11*ms {
		t.Fatalf("after %d latencies of 10ms: %v, want about 10ms", DefaultMinSamples, got)
	}
	// From then on, at most every Window/20.
	for range 1000 {
		d.Record(30 * ms)
	}
	if got := d.Get(); got > 11*ms {
		t.Fatalf("recomputed before Window/20: %v", got)
	}
	clk.Advance(DefaultWindow / 20)
	if got := d.Get(); got < 30*ms || got > 32*ms {
		t.Fatalf("after Window/20: %v, want about 30ms", got)
	}
}

// The delay is the percentile of the latencies, within a bucket (6 %).
func TestPercentile(t *testing.T) {
	for _, p := range []float64{0.5, 0.9, 0.95, 0.99} {
		d, _ := newTest(t, Config{Percentile: p})
		r := rand.New(rand.NewPCG(1, 2))
		for _, i := range r.Perm(1000) {
			d.Record(time.Duration(i+1) * ms) // 1 ms to 1 s, each once
		}
		want := time.Duration(p*1000) * ms
		if got := d.Get(); got < want || float64(got) > 1.07*float64(want) {
			t.Errorf("percentile %v of 1..1000 ms: %v, want %v to 7 %% more", p, got, want)
		}
	}
}

// Latencies older than Window are forgotten; a target that became slower
// gets the new delay within a window.
func TestWindowFollowsTheTarget(t *testing.T) {
	d, clk := newTest(t, Config{})
	for range 500 {
		d.Record(10 * ms)
	}
	if got := d.Get(); got > 11*ms {
		t.Fatalf("fast target: %v, want about 10ms", got)
	}
	// The target is ten times slower from now on: 200 latencies over a
	// window, a little at a time.
	for range 20 {
		clk.Advance(DefaultWindow / 20)
		for range 10 {
			d.Record(100 * ms)
		}
	}
	clk.Advance(DefaultWindow / 20)
	if got := d.Get(); got < 100*ms || got > 107*ms {
		t.Fatalf("a window after the target slowed down: %v, want about 100ms", got)
	}
	// Idle for longer than the window: nothing is left, Initial again.
	clk.Advance(2 * DefaultWindow)
	if got := d.Get(); got != DefaultInitial {
		t.Fatalf("after two idle windows: %v, want Initial %v", got, DefaultInitial)
	}
}

func TestBounds(t *testing.T) {
	d, _ := newTest(t, Config{Min: 20 * ms, Max: 30 * ms, Initial: 5 * ms, MinSamples: 1})
	if got := d.Get(); got != 20*ms {
		t.Fatalf("Initial 5ms with Min 20ms: %v, want 20ms", got)
	}
	d2, _ := newTest(t, Config{Max: 30 * ms, MinSamples: 1})
	d2.Record(time.Second)
	if got := d2.Get(); got != 30*ms {
		t.Fatalf("a 1s latency with Max 30ms: %v, want 30ms", got)
	}
	d2.Record(-time.Second) // ignored
	d3, _ := newTest(t, Config{MinSamples: 1})
	d3.Record(-time.Second)
	if got := d3.Get(); got != DefaultInitial {
		t.Fatalf("only a negative latency recorded: %v, want Initial", got)
	}
}

// Record and Get from many goroutines while the halves turn (run with
// -race): the delay stays within the latencies recorded.
func TestConcurrent(t *testing.T) {
	d, clk := newTest(t, Config{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5000 {
				d.Record(time.Duration(10+(i+g)%10) * ms)
				if i%100 == 0 {
					if got := d.Get(); got != DefaultInitial && (got < 10*ms || got > 21*ms) {
						t.Errorf("delay %v, want within the latencies (10-19 ms) or Initial", got)
						return
					}
				}
			}
		}()
	}
	for range 50 {
		clk.Advance(DefaultWindow / 10)
	}
	wg.Wait()
}

func BenchmarkRecord(b *testing.B) {
	d, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d.Record(12 * ms)
		}
	})
}

func BenchmarkGet(b *testing.B) {
	d, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	for range 1000 {
		d.Record(12 * ms)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = d.Get()
		}
	})
}

// Queueing: a median more than twice the lowest one seen lately; a
// latency that stays up for good stops reading as queueing after some
// 20 s.
func TestQueueing(t *testing.T) {
	d, clk := newTest(t, Config{})
	if d.Queueing() {
		t.Fatal("queueing before any latency")
	}
	for range 200 {
		d.Record(2 * ms)
	}
	d.Get()
	if d.Queueing() {
		t.Fatal("queueing at the latency it always had")
	}
	clk.Advance(DefaultWindow) // the 2 ms are forgotten
	for range 200 {
		d.Record(40 * ms)
	}
	d.Get()
	if !d.Queueing() {
		t.Fatal("median 40 ms after 2 ms: not queueing")
	}
	var took time.Duration
	for took = 0; d.Queueing() && took < 5*time.Minute; took += DefaultWindow / 20 {
		clk.Advance(DefaultWindow / 20)
		for range 20 {
			d.Record(40 * ms)
		}
		d.Get()
	}
	if took < 10*time.Second || took > time.Minute {
		t.Errorf("a latency up for good read as queueing for %v, want 10 s to a minute", took)
	}
}

// Review finding: once the window holds fewer than MinSamples, the
// median is unknown, and a target that was queueing once does not stay
// "queueing" for good on sparse traffic.
func TestQueueingForgetsOnSparseTraffic(t *testing.T) {
	d, clk := newTest(t, Config{MinSamples: 10})
	for range 10 {
		d.Record(2 * ms)
	}
	d.Get()
	clk.Advance(DefaultWindow)
	for range 10 {
		d.Record(40 * ms)
	}
	clk.Advance(DefaultWindow / 20)
	d.Get()
	if !d.Queueing() {
		t.Fatal("median 40 ms after 2 ms: not queueing")
	}
	clk.Advance(DefaultWindow)
	for range 5 {
		d.Record(2 * ms)
	}
	d.Get()
	if d.Queueing() {
		t.Error("five latencies in the window (MinSamples 10): still queueing")
	}
}

// The median is kept whatever the Percentile, below the median too.
func TestQueueingLowPercentile(t *testing.T) {
	d, clk := newTest(t, Config{Percentile: 0.1, MinSamples: 10})
	for range 100 {
		d.Record(2 * ms)
	}
	d.Get()
	clk.Advance(DefaultWindow)
	for i := range 100 {
		d.Record(map[bool]time.Duration{true: ms, false: 80 * ms}[i%5 < 2]) // 40 % at 1 ms, 60 % at 80 ms
	}
	clk.Advance(DefaultWindow / 20)
	if got := d.Get(); got > 2*ms {
		t.Fatalf("10th percentile %v, want about 1 ms", got)
	}
	if !d.Queueing() {
		t.Error("median 80 ms after 2 ms, Percentile 0.1: not queueing")
	}
}

// A queue that builds reads as queueing within a computation or two, not
// once its latencies make up half of the window: a user's trial found
// the rule true only 5 s after a target's median rose 2.5x to 10x at
// 1 000 answers a second, and an edge client hedged into the growing
// queue meanwhile.
func TestQueueingAtOnce(t *testing.T) {
	for _, rise := range []time.Duration{5 * ms, 20 * ms} {
		d, clk := newTest(t, Config{})
		// 10 s at 2 ms, 1 000 answers a second.
		for range 200 {
			for range 50 {
				d.Record(2 * ms)
			}
			clk.Advance(DefaultWindow / 200)
			d.Get()
		}
		if d.Queueing() {
			t.Fatal("queueing at the latency it always had")
		}
		var took time.Duration
		for took = 0; !d.Queueing() && took < 10*time.Second; took += DefaultWindow / 200 {
			for range 50 {
				d.Record(rise)
			}
			clk.Advance(DefaultWindow / 200)
			d.Get()
		}
		if took > time.Second {
			t.Errorf("median 2 ms -> %v: queueing after %v, want within a second", rise, took)
		}
	}
}

// A steady target whose latencies are bimodal (cache hits 1 ms, misses
// 10 ms, 45 % misses) does not read as queueing: the median of the ~40
// latencies since the last computation lands on the slow mode often (a
// review found Queueing, which stops every hedge, on at 65 of 360
// computations at 80 answers a second), their lower quartile does not.
func TestQueueingSteadyBimodal(t *testing.T) {
	for _, perTick := range []int{40, 400} {
		d, clk := newTest(t, Config{})
		r := rand.New(rand.NewPCG(1, 2))
		ticks, queueing := 0, 0
		for i := range 400 { // 20 s, a Get every Window/20
			for range perTick {
				if r.Float64() < 0.45 {
					d.Record(10 * ms)
				} else {
					d.Record(1 * ms)
				}
			}
			clk.Advance(DefaultWindow / 20)
			d.Get()
			if i >= 40 { // after the first 2 s
				ticks++
				if d.Queueing() {
					queueing++
				}
			}
		}
		t.Logf("%d answers per Window/20: queueing at %d of %d computations", perTick, queueing, ticks)
		if queueing > ticks/20 {
			t.Errorf("%d per Window/20: a steady target reads as queueing %d of %d times", perTick, queueing, ticks)
		}
	}
}

// Once a building queue reads as queueing, a switch of the window's
// halves does not make it read otherwise for a computation: the
// latencies since the last one are told per half (a review found a
// 0.5 s gap at each switch, every 5 s).
func TestQueueingThroughSwitches(t *testing.T) {
	d, clk := newTest(t, Config{})
	for range 260 { // 13 s at 2 ms, 1 000 a second
		for range 50 {
			d.Record(2 * ms)
		}
		clk.Advance(DefaultWindow / 200)
		d.Get()
	}
	var trace []byte
	for range 200 { // 10 s at 20 ms
		for range 50 {
			d.Record(20 * ms)
		}
		clk.Advance(DefaultWindow / 200)
		d.Get()
		trace = append(trace, map[bool]byte{true: 'Q', false: '.'}[d.Queueing()])
	}
	// Queueing from the first computation after the rise (every 10th
	// step) at the latest, to the end.
	if i := bytes.IndexByte(trace, 'Q'); i < 0 || i > 10 || bytes.IndexByte(trace[i:], '.') >= 0 {
		t.Errorf("every 50 ms after the rise: %s; want queueing from the first computation on", trace)
	}
}
