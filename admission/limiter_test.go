package admission

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newLimiter(t *testing.T, cfg Config) (*Limiter, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	cfg.Clock = clk
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return l, clk
}

// server is a model of a server with a number of workers and a service
// time, driven in rounds by clients that always fill the limit: n requests
// in flight take service x max(1, n/workers).
type server struct {
	t       *testing.T
	l       *Limiter
	clk     *clock.Fake
	workers int
	service time.Duration
	elapsed time.Duration
}

// run drives the server for d and returns the limit after each round with
// the time it was read.
func (s *server) run(d time.Duration) (at []time.Duration, limits []int) {
	s.t.Helper()
	end := s.elapsed + d
	permits := make([]Permit, 0, 1024)
	for s.elapsed < end {
		n := s.l.Limit()
		permits = permits[:0]
		for range n {
			p, err := s.l.Acquire(ClassFirst, time.Time{})
			if err != nil {
				s.t.Fatalf("at %v: Acquire %d of %d: %v", s.elapsed, len(permits)+1, n, err)
			}
			permits = append(permits, p)
		}
		rtt := time.Duration(float64(s.service) * max(1, float64(n)/float64(s.workers)))
		s.clk.Advance(rtt)
		s.elapsed += rtt
		for _, p := range permits {
			p.Release(Measured)
		}
		at, limits = append(at, s.elapsed), append(limits, s.l.Limit())
	}
	return at, limits
}

// firstBelow returns the time of the first limit below v, or -1.
func firstBelow(at []time.Duration, limits []int, v int) time.Duration {
	for i, l := range limits {
		if l < v {
			return at[i]
		}
	}
	return -1
}

// firstAtLeast returns the time of the first limit >= v, or -1.
func firstAtLeast(at []time.Duration, limits []int, v int) time.Duration {
	for i, l := range limits {
		if l >= v {
			return at[i]
		}
	}
	return -1
}

// TestLimitSettles: on a server with 10 workers that its clients always
// fill, the limit settles where the queue stays short: at least the
// workers, at most a queue of twice them, but for the probes (a quarter,
// not below MinLimit, here 4: below the workers, so that probes drain).
func TestLimitSettles(t *testing.T) {
	l, clk := newLimiter(t, Config{MinLimit: 4})
	s := &server{t: t, l: l, clk: clk, workers: 10, service: 10 * time.Millisecond}
	s.run(3 * time.Second)
	_, limits := s.run(2 * time.Second)
	in := 0
	for i, got := range limits {
		if got < 4 || got > 30 {
			t.Fatalf("round %d of the steady state: limit %d, want 4 to 30 (limits %v)", i, got, limits)
		}
		if got >= 10 {
			in++
		}
	}
	if in < len(limits)*9/10 {
		t.Fatalf("steady state: %d of %d rounds with a limit of 10 to 30, want 90 %% (limits %v)", in, len(limits), limits)
	}
}

// TestLimitReactsToLatencySteps: when the server loses four fifths of its
// workers, its latency steps up (a queue builds) and the limit falls by a
// quarter within 250 ms and to a queue of at most twice the workers
// within a second; when they are back, the latency steps down and the limit is
// back within a second.
func TestLimitReactsToLatencySteps(t *testing.T) {
	l, clk := newLimiter(t, Config{MinLimit: 1})
	s := &server{t: t, l: l, clk: clk, workers: 20, service: 10 * time.Millisecond}
	s.run(3 * time.Second)
	before := l.Limit()

	s.workers = 4
	start := s.elapsed
	at, limits := s.run(time.Second)
	if got := firstBelow(at, limits, before*3/4); got < 0 || got-start > 300*time.Millisecond {
		t.Fatalf("step up: limit below %d after %v, want within 300ms (limits %v)", before*3/4, got-start, limits)
	}
	if got := limits[len(limits)-1]; got > 3*s.workers {
		t.Fatalf("step up: limit %d after 1s, want at most %d (limits %v)", got, 3*s.workers, limits)
	}

	s.workers = 20
	start = s.elapsed
	at, limits = s.run(2 * time.Second)
	if got := firstAtLeast(at, limits, before*3/4); got < 0 || got-start > time.Second {
		t.Fatalf("step down: limit back to %d after %v, want within 1s (limits %v)", before*3/4, got-start, limits)
	}
}

// TestSlowerNotQueued: a server four times slower, without more queue,
// keeps its limit: the probe finds the new service time.
func TestSlowerNotQueued(t *testing.T) {
	l, clk := newLimiter(t, Config{MinLimit: 1})
	s := &server{t: t, l: l, clk: clk, workers: 10, service: 10 * time.Millisecond}
	s.run(3 * time.Second)
	before := l.Limit()
	s.service = 40 * time.Millisecond
	_, limits := s.run(2 * time.Second)
	if got := limits[len(limits)-1]; got < before*3/4 {
		t.Fatalf("after 2s four times slower: limit %d, want at least %d (limits %v)", got, before*3/4, limits)
	}
}

// TestLimitDoesNotGrowUnused: a server that uses less than half of its
// limit does not see it grow, however fast it is.
func TestLimitDoesNotGrowUnused(t *testing.T) {
	l, clk := newLimiter(t, Config{InitialLimit: 20})
	for range 200 {
		var ps [5]Permit
		for i := range ps {
			ps[i], _ = l.Acquire(ClassFirst, time.Time{})
		}
		clk.Advance(time.Millisecond)
		for _, p := range ps {
			p.Release(Measured)
		}
	}
	if got := l.Limit(); got != 20 {
		t.Fatalf("limit after 200 rounds of 5 in flight: got %d, want 20", got)
	}
}

func fill(t *testing.T, l *Limiter, c Class, n int) []Permit {
	t.Helper()
	ps := make([]Permit, n)
	for i := range ps {
		var err error
		if ps[i], err = l.Acquire(c, time.Time{}); err != nil {
			t.Fatalf("Acquire(%v) %d of %d: %v", c, i+1, n, err)
		}
	}
	return ps
}

// TestShedOrder: as the requests in flight approach the limit (10),
// retries are refused first (at 5), then callers already retrying (at 7),
// first attempts last (at 10).
func TestShedOrder(t *testing.T) {
	l, _ := newLimiter(t, Config{InitialLimit: 10, MinLimit: 1})
	admits := func(c Class) bool {
		p, err := l.Acquire(c, time.Time{})
		if err != nil {
			if !errors.Is(err, ErrLimit) {
				t.Fatalf("Acquire(%v): got %v, want ErrLimit", c, err)
			}
			return false
		}
		p.Release(Ignored)
		return true
	}
	want := []struct{ first, upstream, retry bool }{
		0: {true, true, true}, 4: {true, true, true}, 5: {true, true, false},
		6: {true, true, false}, 7: {true, false, false}, 9: {true, false, false}, 10: {false, false, false},
	}
	var held []Permit
	for n := 0; n <= 10; n++ {
		if n > 0 {
			held = append(held, fill(t, l, ClassFirst, 1)...)
		}
		w := want[n]
		if w == (struct{ first, upstream, retry bool }{}) && n != 10 {
			continue
		}
		if got := [3]bool{admits(ClassFirst), admits(ClassUpstreamRetrying), admits(ClassRetry)}; got != [3]bool{w.first, w.upstream, w.retry} {
			t.Errorf("%d in flight: admitted (first, upstream retrying, retry) = %v, want %v", n, got, [3]bool{w.first, w.upstream, w.retry})
		}
	}
	for _, p := range held {
		p.Release(Ignored)
	}
	if got := l.InFlight(); got != 0 {
		t.Fatalf("in flight after releasing all: got %d, want 0", got)
	}
	if got := l.Stats().RejectedLimit; got != 1+1+2+2+3 {
		t.Fatalf("RejectedLimit: got %d, want 9", got)
	}
}

func TestClassOf(t *testing.T) {
	tests := []struct {
		attempt, upstream int
		want              Class
	}{
		{0, 0, ClassFirst}, {0, 2, ClassUpstreamRetrying}, {1, 0, ClassRetry}, {2, 5, ClassRetry},
	}
	for _, tt := range tests {
		if got := ClassOf(tt.attempt, tt.upstream); got != tt.want {
			t.Errorf("ClassOf(%d, %d): got %v, want %v", tt.attempt, tt.upstream, got, tt.want)
		}
	}
}

// TestDeadline: once a window measured 20 ms at least, a request with
// less time left is refused while others are in flight, and admitted when
// the server is idle.
func TestDeadline(t *testing.T) {
	l, clk := newLimiter(t, Config{})
	for range 6 {
		ps := fill(t, l, ClassFirst, 2)
		clk.Advance(20 * time.Millisecond)
		for _, p := range ps {
			p.Release(Measured)
		}
	}
	if got := l.Latency(); got != 20*time.Millisecond {
		t.Fatalf("Latency: got %v, want 20ms", got)
	}
	now := clk.Now()
	// Idle: admitted whatever the deadline.
	p, err := l.Acquire(ClassFirst, now.Add(time.Millisecond))
	if err != nil {
		t.Fatalf("idle server, 1ms left: got %v, want admitted", err)
	}
	// p is in flight now.
	tests := []struct {
		left time.Duration
		want error
	}{
		{time.Millisecond, ErrDeadline},
		{19 * time.Millisecond, ErrDeadline},
		{-time.Second, ErrDeadline},
		{20 * time.Millisecond, nil},
		{time.Second, nil},
	}
	for _, tt := range tests {
		q, err := l.Acquire(ClassFirst, now.Add(tt.left))
		if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
			t.Errorf("%v left: got %v, want %v", tt.left, err, tt.want)
		}
		q.Release(Ignored)
	}
	if q, err := l.Acquire(ClassFirst, time.Time{}); err != nil {
		t.Errorf("no deadline: got %v, want admitted", err)
	} else {
		q.Release(Ignored)
	}
	p.Release(Ignored)
	if got := l.Stats().RejectedDeadline; got != 3 {
		t.Fatalf("RejectedDeadline: got %d, want 3", got)
	}
}

func TestConfigErrors(t *testing.T) {
	bad := []Config{
		{MinLimit: -1}, {MaxLimit: -1}, {InitialLimit: -1},
		{MinLimit: 10, MaxLimit: 5}, {InitialLimit: 3, MinLimit: 4}, {InitialLimit: 2000},
		{Tolerance: 0.5}, {Tolerance: 11}, {Window: time.Microsecond}, {Window: time.Minute},
		{RetryShare: -0.1}, {RetryShare: 1.5},
	}
	for _, c := range bad {
		if _, err := New(c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v): got %v, want ErrInvalidConfig", c, err)
		}
	}
	l, err := New(Config{MinLimit: 50})
	if err != nil {
		t.Fatalf("New(MinLimit 50): %v", err)
	}
	if got := l.Config(); got.InitialLimit != 50 || got.MaxLimit != 1000 || got.Tolerance != DefaultTolerance || got.Window != DefaultWindow || got.RetryShare != DefaultRetryShare {
		t.Fatalf("resolved config: got %+v", got)
	}
}

func TestZeroPermit(t *testing.T) {
	var p Permit
	p.Release(Measured) // must not panic
}

// TestClockBackwards: a clock that goes back neither panics nor records a
// negative latency.
func TestClockBackwards(t *testing.T) {
	l, clk := newLimiter(t, Config{})
	for range 20 {
		ps := fill(t, l, ClassFirst, 4)
		clk.Advance(-10 * time.Millisecond)
		for _, p := range ps {
			p.Release(Measured)
		}
	}
	if got := l.Latency(); got < 0 {
		t.Fatalf("Latency: got %v, want >= 0", got)
	}
	if got := l.Limit(); got < DefaultMinLimit || got > DefaultMaxLimit {
		t.Fatalf("Limit: got %d, want within bounds", got)
	}
}

// TestConcurrent: under parallel use the count in flight never exceeds the
// limit by more than the limit's own fall, and ends at zero.
func TestConcurrent(t *testing.T) {
	l, err := New(Config{InitialLimit: 8, MinLimit: 8, MaxLimit: 8})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	over := 0
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				p, err := l.Acquire(Class((g+i)%3), time.Time{})
				if err != nil {
					continue
				}
				if l.InFlight() > 8 {
					mu.Lock()
					over++
					mu.Unlock()
				}
				p.Release(Measured)
			}
		}()
	}
	wg.Wait()
	if over > 0 || l.InFlight() != 0 {
		t.Fatalf("over the limit %d times, %d left in flight; want 0 and 0", over, l.InFlight())
	}
}

// TestDeadlineQueue: the latency a request can expect grows with the
// requests in flight ahead of it (Little's law): with 5 in flight, a
// request needs 6 times the time per request finished in the last window.
func TestDeadlineQueue(t *testing.T) {
	l, clk := newLimiter(t, Config{MinLimit: 10})
	for range 4 {
		ps := fill(t, l, ClassFirst, 2)
		clk.Advance(20 * time.Millisecond)
		for _, p := range ps {
			p.Release(Measured)
		}
	}
	per := time.Duration(l.perDone.Load())
	if per <= 0 || 6*per <= l.Latency() {
		t.Fatalf("time per request %v: want > 0 and 6 times it above the least latency %v", per, l.Latency())
	}
	held := fill(t, l, ClassFirst, 5)
	now := clk.Now()
	if _, err := l.Acquire(ClassFirst, now.Add(6*per-1)); !errors.Is(err, ErrDeadline) {
		t.Fatalf("%v left behind 5 in flight at %v each: got %v, want ErrDeadline", 6*per-1, per, err)
	}
	p, err := l.Acquire(ClassFirst, now.Add(6*per))
	if err != nil {
		t.Fatalf("%v left behind 5 in flight at %v each: got %v, want admitted", 6*per, per, err)
	}
	p.Release(Ignored)
	for _, p := range held {
		p.Release(Ignored)
	}
}
