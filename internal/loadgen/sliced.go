package loadgen

import (
	"context"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Warm sends one request through the healthy chain, so that every hop is
// connected before a scenario starts, and then zeroes the counters. It
// waits for connections with WaitForReady, bounded by a deadline.
func Warm(c *testsvc.Chain) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range c.Tiers() {
		conn := c.Conn(i)
		for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
			conn.Connect()
			if !conn.WaitForStateChange(ctx, s) {
				return fmt.Errorf("hop %d did not connect", i)
			}
		}
	}
	if _, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{Id: "warm"}); err != nil {
		return fmt.Errorf("warm-up request: %w", err)
	}
	// Replicas behind round_robin: picks go to the connected ones only,
	// so request until every replica has served one.
	for _, t := range c.Tiers() {
		reps := c.Replicas(t.Name())
		for !allReceived(reps) {
			if _, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{Id: "warm"}); err != nil {
				return fmt.Errorf("warm-up request to the replicas of %s: %w", t.Name(), err)
			}
		}
	}
	for _, t := range c.Tiers() {
		for _, r := range c.Replicas(t.Name()) {
			r.ResetCounts()
		}
	}
	return nil
}

func allReceived(reps []*testsvc.Tier) bool {
	for _, r := range reps {
		if r.Received(testsvc.Unary) == 0 {
			return false
		}
	}
	return true
}

// Step is a change of the chain's faults at a time since the start of
// the load.
type Step struct {
	At time.Duration
	Do func()
}

// Slice is what the user requests that started in one time slice saw,
// and the calls the counted tier received in it.
type Slice struct {
	Start   time.Duration
	Samples Samples
	Calls   int64
}

// PerRequest returns the calls of the slice per user request, 0 without
// requests.
func (s Slice) PerRequest() float64 {
	if len(s.Samples) == 0 {
		return 0
	}
	return float64(s.Calls) / float64(len(s.Samples))
}

// Sliced runs an open-loop load (see OpenLoop) of rate requests per
// second for total, each request with deadline; it takes each step once
// when its time has come (steps in order of At), and reads count (the
// calls at the tier watched) at every boundary of slices of width. It
// returns every sample and the slices.
func Sliced(c *testsvc.Chain, rate int, total, deadline, width time.Duration, count func() int64, steps []Step) (Samples, []Slice) {
	n := int((total + width - 1) / width)
	marks := make([]int64, n+1)
	next, step := 0, 0
	s := OpenLoop(c, rate, total, deadline, func(elapsed time.Duration) {
		for next <= n && elapsed >= time.Duration(next)*width {
			marks[next] = count()
			next++
		}
		for step < len(steps) && elapsed >= steps[step].At {
			steps[step].Do()
			step++
		}
	})
	final := count()
	for ; next <= n; next++ {
		marks[next] = final
	}
	slices := make([]Slice, n)
	for i := range n {
		from, to := time.Duration(i)*width, time.Duration(i+1)*width
		if i == n-1 {
			// A request sent at the last tick may start (in its own
			// goroutine) after total: it belongs to the last slice.
			to = math.MaxInt64
		}
		slices[i] = Slice{Start: from, Samples: s.Between(from, to), Calls: marks[i+1] - marks[i]}
	}
	return s, slices
}

// Sum returns the slices that start in [from, to) as one slice.
func Sum(slices []Slice, from, to time.Duration) Slice {
	out := Slice{Start: from}
	for _, sl := range slices {
		if sl.Start >= from && sl.Start < to {
			out.Samples = append(out.Samples, sl.Samples...)
			out.Calls += sl.Calls
		}
	}
	return out
}

// Recovery returns the time from end to the end of the last slice of
// width (by request start), before until, in which less than 99 % of the
// requests succeeded; ok is false when that slice is the last one, so
// the load ended before the users were served again.
func (s Samples) Recovery(end, until, width time.Duration) (d time.Duration, ok bool) {
	last := time.Duration(0) // the end of the last slice, from end
	for from := end; from+width <= until; from += width {
		last = from + width - end
		if b := s.Between(from, from+width); len(b) > 0 && b.Success() < 0.99 {
			d = last
		}
	}
	return d, d < last
}

// Marker reads counters at every boundary of slices of width and takes
// steps when their time has come, from the phase callback of a load
// (OpenLoopRates, FixedConcurrency), for loads whose slices need more
// than Sliced's one count.
type Marker struct {
	width      time.Duration
	read       func() []int64
	steps      []Step
	marks      [][]int64 // marks[i]: the counters at the start of slice i
	next, step int
}

// NewMarker returns a Marker of the slices of width that cover total,
// which reads the counters with read and takes steps (in order of At).
func NewMarker(total, width time.Duration, read func() []int64, steps []Step) *Marker {
	n := int((total + width - 1) / width)
	return &Marker{width: width, read: read, steps: steps, marks: make([][]int64, n+1)}
}

// Phase is the load's phase callback.
func (m *Marker) Phase(elapsed time.Duration) {
	for m.next < len(m.marks) && elapsed >= time.Duration(m.next)*m.width {
		m.marks[m.next] = m.read()
		m.next++
	}
	for m.step < len(m.steps) && elapsed >= m.steps[m.step].At {
		m.steps[m.step].Do()
		m.step++
	}
}

// Finish reads the counters once more, after the load has ended: the
// end of the last slice, and of any slice the load did not reach.
func (m *Marker) Finish() {
	final := m.read()
	for ; m.next < len(m.marks); m.next++ {
		m.marks[m.next] = final
	}
}

// Slices returns the number of slices.
func (m *Marker) Slices() int { return len(m.marks) - 1 }

// Counts returns what each counter counted in slice i (after Finish).
func (m *Marker) Counts(i int) []int64 {
	from, to := m.marks[i], m.marks[i+1]
	out := make([]int64, len(to))
	for k := range to {
		out[k] = to[k] - from[k]
	}
	return out
}

// Samples returns the samples of slice i of s, by start; the last slice
// also takes the requests that started after its end (sent at the last
// tick, started in their own goroutine).
func (m *Marker) Samples(s Samples, i int) Samples {
	from, to := time.Duration(i)*m.width, time.Duration(i+1)*m.width
	if i == m.Slices()-1 {
		to = math.MaxInt64
	}
	return s.Between(from, to)
}
