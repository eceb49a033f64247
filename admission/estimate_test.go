package admission

import (
	"errors"
	"testing"
	"time"
)

// The deadline rule's estimate (issue 14 review): the time per request is
// measured over busy time, not over the window, and an estimate that
// cannot update is not used.

// TestDeadlineQuietServer: at 10 requests/s of 5 ms each, the time per
// request is the service time (5 ms), not the gap between arrivals
// (100 ms); with one request in flight, a request with 150 ms left is
// admitted. The old estimate (window / completions, 66 ms) refused it:
// 2 x 66 ms > 150 ms.
func TestDeadlineQuietServer(t *testing.T) {
	l, clk := newLimiter(t, Config{})
	for i := range 20 {
		p, err := l.Acquire(ClassFirst, clk.Now().Add(time.Second))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		clk.Advance(5 * time.Millisecond)
		p.Release(Measured)
		clk.Advance(95 * time.Millisecond)
	}
	if per := time.Duration(l.perDone.Load()); per != 5*time.Millisecond {
		t.Fatalf("time per request: got %v, want the 5ms service time", per)
	}
	p, err := l.Acquire(ClassFirst, clk.Now().Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(Measured)
	q, err := l.Acquire(ClassFirst, clk.Now().Add(150*time.Millisecond))
	if err != nil {
		t.Fatalf("second request with 150ms left at a 5ms server: got %v, want admitted", err)
	}
	q.Release(Measured)
}

// TestDeadlineLongRequestsInFlight: 5 requests stay in flight for good
// (say, stuck handlers) while a quiet server serves 1 request/s in 5 ms;
// none of 30 requests with 2 s left is refused. The old estimate took the
// window (1 s) over 2 completions and refused 28 of them, and refused
// requests measure nothing, so it never changed.
func TestDeadlineLongRequestsInFlight(t *testing.T) {
	l, clk := newLimiter(t, Config{})
	held := fill(t, l, ClassFirst, 5)
	refused := 0
	for range 30 {
		p, err := l.Acquire(ClassFirst, clk.Now().Add(2*time.Second))
		if err != nil {
			refused++
			clk.Advance(time.Second)
			continue
		}
		clk.Advance(5 * time.Millisecond)
		p.Release(Measured)
		clk.Advance(995 * time.Millisecond)
	}
	if refused > 0 {
		t.Fatalf("%d of 30 requests with 2s left refused at a 5ms server; stats %+v", refused, l.Stats())
	}
	for _, p := range held {
		p.Release(Ignored)
	}
}

// TestDeadlineBusyServer: on a saturated server (4 workers, 10 ms each,
// 40 in flight) the time per request is one over the throughput (2.5 ms),
// and a request behind the 40 in flight needs 41 x 2.5 ms: the rule still
// refuses what a FIFO queue cannot serve in time.
func TestDeadlineBusyServer(t *testing.T) {
	l, clk := newLimiter(t, Config{InitialLimit: 100, MinLimit: 50, MaxLimit: 100})
	held := fill(t, l, ClassFirst, 40)
	clk.Advance(97500 * time.Microsecond)
	// The workers finish one request every 2.5 ms, the oldest, after
	// 100 ms in the queue and in service; a new one takes its place.
	for range 60 {
		clk.Advance(2500 * time.Microsecond)
		held[0].Release(Measured)
		p, err := l.Acquire(ClassFirst, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held[1:], p)
	}
	per := time.Duration(l.perDone.Load())
	if per != 2500*time.Microsecond {
		t.Fatalf("time per request: got %v, want 2.5ms (1 / throughput)", per)
	}
	need := 41 * per
	if _, err := l.Acquire(ClassFirst, clk.Now().Add(need-time.Millisecond)); !errors.Is(err, ErrDeadline) {
		t.Fatalf("%v left behind 40 in flight: got %v, want ErrDeadline", need-time.Millisecond, err)
	}
	p, err := l.Acquire(ClassFirst, clk.Now().Add(need))
	if err != nil {
		t.Fatalf("%v left behind 40 in flight: got %v, want admitted", need, err)
	}
	p.Release(Ignored)
	for _, p := range held {
		p.Release(Ignored)
	}
}

// TestDeadlineEstimateNotStuck: the estimate says a request needs far
// more than the deadlines offered, requests stay in flight, and nothing
// completes: refused requests measure nothing, so the estimate cannot
// update. Once no request ended for 4 windows it is not used, a request
// is admitted, and the estimate follows the new latency.
func TestDeadlineEstimateNotStuck(t *testing.T) {
	l, clk := newLimiter(t, Config{})
	// A window of 4 requests of 1 s each: 1 s needed at least.
	for range 2 {
		ps := fill(t, l, ClassFirst, 4)
		clk.Advance(time.Second)
		for _, p := range ps {
			p.Release(Measured)
		}
	}
	if got := l.Latency(); got != time.Second {
		t.Fatalf("Latency: got %v, want 1s", got)
	}
	held := fill(t, l, ClassFirst, 3)
	if _, err := l.Acquire(ClassFirst, clk.Now().Add(100*time.Millisecond)); !errors.Is(err, ErrDeadline) {
		t.Fatalf("fresh estimate of 1s, 100ms left: got %v, want ErrDeadline", err)
	}
	stale := slowWindows * l.Config().Window
	clk.Advance(stale)
	if _, err := l.Acquire(ClassFirst, clk.Now().Add(100*time.Millisecond)); !errors.Is(err, ErrDeadline) {
		t.Fatalf("%v after the last completion, 100ms left: got %v, want ErrDeadline (still fresh)", stale, err)
	}
	clk.Advance(time.Millisecond)
	p, err := l.Acquire(ClassFirst, clk.Now().Add(100*time.Millisecond))
	if err != nil {
		t.Fatalf("no completion for over 4 windows, 100ms left: got %v, want admitted", err)
	}
	clk.Advance(5 * time.Millisecond)
	p.Release(Measured)
	// The server now serves in 5 ms, a request every 10 ms: within a few
	// stale periods, the estimate has followed and none is refused.
	lastRefused := -1
	for i := range 100 {
		p, err := l.Acquire(ClassFirst, clk.Now().Add(100*time.Millisecond))
		if err != nil {
			lastRefused = i
			clk.Advance(10 * time.Millisecond)
			continue
		}
		clk.Advance(5 * time.Millisecond)
		p.Release(Measured)
		clk.Advance(5 * time.Millisecond)
	}
	if lastRefused >= 50 {
		t.Fatalf("requests of 5ms with 100ms left still refused after %v (request %d)", time.Duration(lastRefused)*10*time.Millisecond, lastRefused)
	}
	if got := l.Latency(); got != 5*time.Millisecond {
		t.Fatalf("Latency: got %v, want 5ms", got)
	}
	for _, p := range held {
		p.Release(Ignored)
	}
}
