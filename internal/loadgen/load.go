package loadgen

import (
	"context"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Sample is one user request: when it started (since the start of the
// load), how long the user waited, and the code the user got.
type Sample struct {
	Start   time.Duration
	Latency time.Duration
	Code    codes.Code
}

// Samples is what the users of one load saw.
type Samples []Sample

// Success returns the share of requests that succeeded, 0 for none.
func (s Samples) Success() float64 {
	if len(s) == 0 {
		return 0
	}
	ok := 0
	for _, x := range s {
		if x.Code == codes.OK {
			ok++
		}
	}
	return float64(ok) / float64(len(s))
}

// Percentile returns the latency at quantile p in [0, 1] (nearest rank:
// the smallest latency that at least p of the samples do not exceed).
func (s Samples) Percentile(p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	l := make([]time.Duration, len(s))
	for i, x := range s {
		l[i] = x.Latency
	}
	slices.Sort(l)
	i := int(math.Ceil(p*float64(len(l)))) - 1
	return l[max(0, min(len(l)-1, i))]
}

// Between returns the samples that started in [from, to).
func (s Samples) Between(from, to time.Duration) Samples {
	var out Samples
	for _, x := range s {
		if x.Start >= from && x.Start < to {
			out = append(out, x)
		}
	}
	return out
}

// Codes counts the samples by code, for diagnostics.
func (s Samples) Codes() map[codes.Code]int {
	m := map[codes.Code]int{}
	for _, x := range s {
		m[x.Code]++
	}
	return m
}

// Collector gathers samples from many goroutines, with times since its
// creation. Several loads may share one, to put their samples on one
// time axis.
type Collector struct {
	start time.Time
	mu    sync.Mutex
	s     Samples
	seq   atomic.Int64
}

// NewCollector returns a collector whose time 0 is now.
func NewCollector() *Collector { return &Collector{start: time.Now()} }

// call sends one user request with its own deadline and records it.
func (c *Collector) call(ctx context.Context, cl testsvcv1.TestServiceClient, deadline time.Duration) {
	id := strconv.FormatInt(c.seq.Add(1), 10)
	rctx, cancel := context.WithTimeout(ctx, deadline)
	begin := time.Now()
	_, err := cl.Unary(rctx, &testsvcv1.UnaryRequest{Id: id})
	end := time.Now()
	cancel()
	c.mu.Lock()
	c.s = append(c.s, Sample{Start: begin.Sub(c.start), Latency: end.Sub(begin), Code: status.Code(err)})
	c.mu.Unlock()
}

// Start returns the collector's time 0.
func (c *Collector) Start() time.Time { return c.start }

// Samples returns the samples recorded so far.
func (c *Collector) Samples() Samples {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.s)
}

// ClosedLoop runs users goroutines that each send one request after the
// other, every request with the given deadline, until n requests have
// started (n > 0) or, for n == 0, until stop is closed. It returns when
// every request has ended.
func ClosedLoop(c *testsvc.Chain, users, n int, deadline time.Duration, stop <-chan struct{}) Samples {
	return ClosedLoopInto(NewCollector(), c, users, n, deadline, stop)
}

// ClosedLoopInto is ClosedLoop recording into col; it returns every
// sample col holds.
func ClosedLoopInto(col *Collector, c *testsvc.Chain, users, n int, deadline time.Duration, stop <-chan struct{}) Samples {
	var (
		wg      sync.WaitGroup
		started atomic.Int64
	)
	for range users {
		wg.Go(func() {
			cl := c.Client()
			for {
				if n > 0 {
					if started.Add(1) > int64(n) {
						return
					}
				} else {
					select {
					case <-stop:
						return
					default:
					}
				}
				col.call(context.Background(), cl, deadline)
			}
		})
	}
	wg.Wait()
	return col.Samples()
}

// OpenLoop sends requests at a fixed rate, each in its own goroutine with
// the given deadline, whatever the chain does: arrivals do not wait for
// answers. phase is called at every tick with the time since the start and
// may change faults; the load ends after total. It returns when every
// request has ended.
func OpenLoop(c *testsvc.Chain, perSecond int, total, deadline time.Duration, phase func(elapsed time.Duration)) Samples {
	col := NewCollector()
	cl := c.Client()
	interval := time.Second / time.Duration(perSecond)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var wg sync.WaitGroup
	// Arrivals are scheduled from the start time, not from the last tick,
	// so a late tick sends the requests it owes at once.
	sent := 0
	for {
		elapsed := time.Since(col.start)
		if elapsed >= total {
			break
		}
		if phase != nil {
			phase(elapsed)
		}
		due := int(elapsed/interval) + 1
		for ; sent < due; sent++ {
			wg.Go(func() { col.call(context.Background(), cl, deadline) })
		}
		<-tick.C
	}
	wg.Wait()
	return col.Samples()
}

// FixedConcurrency runs users callers at a fixed concurrency for total,
// as a load test does (ghz -c users): each sends its next request, with
// the given deadline, the moment the answer to its previous one comes,
// error or not, with no pause. phase is called on one goroutine every
// tick with the time since the start (0 first), and may change faults or
// read counters. It returns when every request has ended.
func FixedConcurrency(c *testsvc.Chain, users int, total, deadline, tick time.Duration, phase func(elapsed time.Duration)) Samples {
	col := NewCollector()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		ClosedLoopInto(col, c, users, 0, deadline, stop)
		close(done)
	}()
	drive(col.start, total, tick, phase)
	close(stop)
	<-done
	return col.Samples()
}

// drive calls phase (if not nil) every tick from start until total has
// passed.
func drive(start time.Time, total, tick time.Duration, phase func(time.Duration)) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		elapsed := time.Since(start)
		if elapsed >= total {
			return
		}
		if phase != nil {
			phase(elapsed)
		}
		<-t.C
	}
}

// Rate is one phase of an open-loop load: PerSecond arrivals a second
// from From (since the start of the load) until the next phase.
type Rate struct {
	From      time.Duration
	PerSecond int
}

// arrivalsBy returns the arrivals due in [0, elapsed] under rates (From
// ascending, the first at 0), the first of each phase at its start.
func arrivalsBy(rates []Rate, elapsed time.Duration) int {
	n := 0
	for i, r := range rates {
		if elapsed < r.From || r.PerSecond <= 0 {
			continue
		}
		end := elapsed
		if i+1 < len(rates) && rates[i+1].From <= elapsed {
			end = rates[i+1].From - 1 // the next phase owns its start
		}
		interval := time.Second / time.Duration(r.PerSecond)
		n += int((end-r.From)/interval) + 1
	}
	return n
}

// OpenLoopRates is OpenLoop with a rate that changes by phase (rates in
// order of From, the first from 0): arrivals are scheduled from the start
// of each phase, whatever the chain does, and a late tick sends the
// requests it owes at once. phase is called at every tick (1 ms, or the
// interval of the highest rate when shorter).
func OpenLoopRates(c *testsvc.Chain, rates []Rate, total, deadline time.Duration, phase func(elapsed time.Duration)) Samples {
	col := NewCollector()
	cl := c.Client()
	tick := time.Millisecond
	for _, r := range rates {
		if r.PerSecond > 0 {
			tick = min(tick, time.Second/time.Duration(r.PerSecond))
		}
	}
	var wg sync.WaitGroup
	sent := 0
	drive(col.start, total, tick, func(elapsed time.Duration) {
		if phase != nil {
			phase(elapsed)
		}
		for due := arrivalsBy(rates, elapsed); sent < due; sent++ {
			wg.Go(func() { col.call(context.Background(), cl, deadline) })
		}
	})
	wg.Wait()
	return col.Samples()
}
