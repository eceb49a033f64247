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

func TestConfigErrors(t *testing.T) {
	bad := []Config{
		{Target: -time.Millisecond}, {Target: 2 * time.Minute},
		{Window: time.Microsecond}, {Window: 2 * time.Second},
		{RetryShare: -0.1}, {RetryShare: 1.5},
		{MaxInFlight: -1}, {QueueSize: 4},
	}
	for _, c := range bad {
		if _, err := New(c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v): got %v, want ErrInvalidConfig", c, err)
		}
	}
	l, err := New(Config{})
	if err != nil {
		t.Fatalf("New(Config{}): %v", err)
	}
	if got := l.Config(); got.Target != DefaultTarget || got.Window != DefaultWindow || got.RetryShare != DefaultRetryShare || got.MaxInFlight != 0 {
		t.Fatalf("resolved config: got %+v", got)
	}
}

func TestZeroPermit(t *testing.T) {
	var p Permit
	p.Release(Measured) // must not panic
}

// A clock that goes back neither panics nor records a negative latency,
// nor overloads a server.
func TestClockBackwards(t *testing.T) {
	l, clk := newLimiter(t, Config{})
	for range 200 {
		var ps []Permit
		for range 16 {
			p, err := l.Acquire(ClassFirst, time.Time{})
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			ps = append(ps, p)
		}
		clk.Advance(-10 * time.Millisecond)
		for _, p := range ps {
			p.Release(Measured)
		}
	}
	if st := l.Stats(); st.Latency < 0 || st.Base < 0 || st.Overloaded || st.InFlight != 0 {
		t.Fatalf("after a clock going back: %+v", st)
	}
}

// Parallel requests on the system clock: nothing is left in flight.
func TestConcurrent(t *testing.T) {
	l, err := New(Config{Window: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				p, err := l.Acquire(Class(i%3), time.Time{})
				if err != nil {
					continue
				}
				if (i+g)%4 == 0 {
					p.Release(Failed)
				} else {
					p.Release(Measured)
				}
			}
		})
	}
	wg.Wait()
	if got := l.InFlight(); got != 0 {
		t.Fatalf("InFlight after all released: %d", got)
	}
}

// A request whose deadline is shorter than the latency it can expect is
// refused only while the server is overloaded: a closed loop whose
// callers set too short a deadline gets its answers late, as without
// admission control, not refusals.
func TestDeadlineOnlyWhenOverloaded(t *testing.T) {
	s := newSim(t, Config{}, 8, time.Millisecond, 5)
	s.closed(512, 0, time.Second) // 64 ms of latency
	s.run(500 * time.Millisecond)
	if lat := s.l.Latency(); lat < 30*time.Millisecond {
		t.Fatalf("Latency %v with 512 callers: want about 64ms", lat)
	}
	p, err := s.l.Acquire(ClassFirst, s.clk.Now().Add(time.Millisecond))
	if err != nil {
		t.Fatalf("not overloaded, 1 ms left of an expected %v: got %v, want admitted", s.l.Latency(), err)
	}
	p.Release(Ignored)

	s = newSim(t, Config{}, 8, time.Millisecond, 6)
	s.open(4*8000, 0, time.Second, 0)
	s.run(500 * time.Millisecond)
	if !s.l.Overloaded() {
		t.Fatal("4x open loop: not overloaded")
	}
	if _, err := s.l.Acquire(ClassFirst, s.clk.Now().Add(time.Microsecond)); !errors.Is(err, ErrDeadline) {
		t.Fatalf("overloaded, 1 µs left: got %v, want ErrDeadline", err)
	}
	if s.l.Stats().RejectedDeadline == 0 {
		t.Fatal("RejectedDeadline not counted")
	}
}

// Under overload, retries are refused first, then callers already
// retrying; first attempts are served.
func TestRetriesShedFirst(t *testing.T) {
	s := newSim(t, Config{}, 8, time.Millisecond, 7)
	n := 0
	s.classOf = func() Class { n++; return Class(n % int(numClasses)) } // a quarter of each
	s.open(2*8000, 0, 2*time.Second, time.Second)
	s.run(2 * time.Second)
	var refused, all [numClasses]int
	for _, r := range s.results {
		if r.at < 250*time.Millisecond {
			continue
		}
		all[r.class]++
		if r.refused {
			refused[r.class]++
		}
	}
	share := func(c Class) float64 { return float64(refused[c]) / float64(all[c]) }
	t.Logf("refused: first %.3f, upstream retrying %.3f, retry %.3f, hedge %.3f", share(ClassFirst), share(ClassUpstreamRetrying), share(ClassRetry), share(ClassHedge))
	if !(share(ClassFirst) < share(ClassUpstreamRetrying) && share(ClassUpstreamRetrying) < share(ClassRetry) && share(ClassRetry) < share(ClassHedge)) {
		t.Errorf("shed order: first %.3f, upstream retrying %.3f, retry %.3f, hedge %.3f: want hedges first, then retries",
			share(ClassFirst), share(ClassUpstreamRetrying), share(ClassRetry), share(ClassHedge))
	}
	if share(ClassFirst) > 0.1 {
		t.Errorf("first attempts refused %.3f at 2x with three quarters of the load retries and hedges: want them served", share(ClassFirst))
	}
}

// Fast failures (a dependency that fails at once) do not lower the
// server's latency without a queue, and after them the server is not
// refused anything (review finding 8: after an outage a limit from
// latency had fallen from 131 to 18 and refused 276 requests in 250 ms).
func TestFastFailuresKeepBase(t *testing.T) {
	s := newSim(t, Config{}, 64, 5*time.Millisecond, 8)
	s.closed(64, 0, 3*time.Second)
	s.run(time.Second)
	base := s.l.Stats().Base
	if base < 5*time.Millisecond || base > 6*time.Millisecond {
		t.Fatalf("Base %v, want the 5 ms service time", base)
	}
	outage := true
	s.fail = func() (bool, time.Duration) { return outage, 10 * time.Microsecond }
	s.run(2 * time.Second)
	if got := s.l.Stats().Base; got != base {
		t.Errorf("Base after a second of fast failures: %v, want %v", got, base)
	}
	outage = false
	s.run(3 * time.Second)
	if refused, served, _ := s.in(0, 3*time.Second); refused != 0 {
		t.Errorf("%d of %d refused through and after the outage", refused, refused+served)
	}
}

// served runs n requests one after another through l, each served in
// 1 ms, gap apart.
func served(t *testing.T, l *Limiter, clk *clock.Fake, n int, gap time.Duration) {
	t.Helper()
	for range n {
		p, err := l.Acquire(ClassFirst, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Millisecond)
		p.Release(Measured)
		clk.Advance(gap)
	}
}

// After an idle stretch, Latency is what the recent requests took, not
// the requests in flight times the time per completion over windows that
// were mostly idle: read so, a server answering in about 30 ms read 11 to
// 15 s the moment a batch job's 64 workers started after an idle second
// (a user's trial), and a gauge of it would page at every batch start.
func TestLatencyAfterIdle(t *testing.T) {
	l, clk := newLimiter(t, Config{})
	served(t, l, clk, 200, 0)                  // healthy: 1 ms each, one at a time
	clk.Advance(2 * time.Second)               // idle
	served(t, l, clk, 3, 300*time.Millisecond) // a few requests, far apart
	var held []Permit
	defer func() {
		for _, p := range held {
			p.Release(Ignored)
		}
	}()
	for range 64 { // the batch starts
		p, err := l.Acquire(ClassFirst, time.Time{})
		if err != nil {
			t.Fatalf("the batch's request %d: %v", len(held), err)
		}
		held = append(held, p)
	}
	if lat := l.Latency(); lat <= 0 || lat > 100*time.Millisecond {
		t.Fatalf("Latency %v with 64 just admitted after an idle stretch, requests taking 1 ms: want the recent mean, about 1 ms", lat)
	}
}

// Through a hang below, whose requests all end at their callers'
// deadlines, Latency reads what they take, not the successes' mean from
// before it (a review: 30 ms with 90-100 in flight, once the server had
// left its suspect phase).
func TestLatencyThroughHang(t *testing.T) {
	l, clk := newLimiter(t, Config{})
	served(t, l, clk, 2000, 9*time.Millisecond) // healthy: 1 ms each, 100 a second
	type req struct {
		p  Permit
		at time.Time
	}
	var held []req
	defer func() {
		for _, r := range held {
			r.p.Release(Ignored)
		}
	}()
	for range 500 { // 5 s of a hang: each request ends at its 1 s deadline
		if p, err := l.Acquire(ClassFirst, clk.Now().Add(time.Second)); err == nil {
			held = append(held, req{p, clk.Now()})
		}
		clk.Advance(10 * time.Millisecond)
		for len(held) > 0 && clk.Now().Sub(held[0].at) >= time.Second {
			held[0].p.Release(Abandoned)
			held = held[1:]
		}
	}
	if lat := l.Latency(); lat < 500*time.Millisecond {
		t.Fatalf("Latency %v after 5 s of requests ending at their 1 s deadlines, %d in flight: want about 1 s", lat, l.InFlight())
	}
}

// While requests are in flight and none completes (a stall, or a hang
// below), Latency is not zero: the time per completion is at least the
// windows in which none came. Read as zero, its gauge stayed at zero for
// the first second of a hang while the requests in flight rose from 61
// to 285 (a user's trial).
func TestLatencyDuringStall(t *testing.T) {
	l, clk := newLimiter(t, Config{})
	for range 200 { // healthy: 1 ms each
		p, err := l.Acquire(ClassFirst, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Millisecond)
		p.Release(Measured)
	}
	if lat := l.Latency(); lat <= 0 || lat > 10*time.Millisecond {
		t.Fatalf("Latency %v while healthy, want about 1 ms", lat)
	}
	for range 100 { // nothing completes from here on
		_, _ = l.Acquire(ClassFirst, time.Time{})
		clk.Advance(time.Millisecond)
	}
	in := l.InFlight()
	if in == 0 {
		t.Fatal("setup: nothing in flight")
	}
	if lat, want := l.Latency(), time.Duration(in+1)*3*DefaultWindow; lat < want {
		t.Fatalf("Latency %v with %d in flight and nothing completed for 100 ms, want at least %v", lat, in, want)
	}
}
