package breaker

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// half is a jitter source that makes every jittered interval exact.
func half() float64 { return 0.5 }

// newTest returns a breaker on a fake clock with no jitter offset unless
// cfg sets its own Rand.
func newTest(t testing.TB, cfg Config) (*Breaker, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	cfg.Clock = clk
	if cfg.Rand == nil {
		cfg.Rand = half
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b, clk
}

// call makes one call with outcome o and reports whether it was allowed.
func call(t testing.TB, b *Breaker, o Outcome) bool {
	t.Helper()
	p, err := b.Allow()
	if err != nil {
		if !errors.Is(err, ErrOpen) {
			t.Fatalf("Allow: got error %v, want ErrOpen", err)
		}
		return false
	}
	p.Done(o)
	return true
}

func calls(t testing.TB, b *Breaker, n int, o Outcome) {
	t.Helper()
	for i := range n {
		if !call(t, b, o) {
			t.Fatalf("call %d of %d rejected in state %v", i+1, n, b.State())
		}
	}
}

func wantState(t testing.TB, b *Breaker, want State) {
	t.Helper()
	if got := b.State(); got != want {
		t.Fatalf("got state %v, want %v", got, want)
	}
}

// trip opens a closed breaker with MinimumCalls failures.
func trip(t testing.TB, b *Breaker) {
	t.Helper()
	calls(t, b, b.cfg.MinimumCalls, Failure)
	wantState(t, b, Open)
}

func TestStringers(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{Closed.String(), "closed"},
		{Open.String(), "open"},
		{HalfOpen.String(), "half-open"},
		{State(7).String(), "State(7)"},
		{Success.String(), "success"},
		{Failure.String(), "failure"},
		{Ignored.String(), "ignored"},
		{Outcome(-1).String(), "Outcome(-1)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestFullFailureOpensAtMinimumCalls: at the defaults, 100 % failures open
// the breaker within the minimum volume, exactly at the 100th failure.
func TestFullFailureOpensAtMinimumCalls(t *testing.T) {
	b, _ := newTest(t, Config{})
	for i := 1; i < 100; i++ {
		call(t, b, Failure)
		wantState(t, b, Closed)
	}
	call(t, b, Failure)
	wantState(t, b, Open)
	if s := b.Snapshot(); s.Calls != 100 || s.Failures != 100 || s.TimesOpened != 1 {
		t.Fatalf("got %+v, want open once after 100 calls, 100 failures", s)
	}
	if _, err := b.Allow(); !errors.Is(err, ErrOpen) {
		t.Fatalf("Allow on open breaker: got %v, want ErrOpen", err)
	}
}

func TestFailureRateThreshold(t *testing.T) {
	for _, tc := range []struct {
		name                string
		cfg                 Config
		successes, failures int
		want                State
	}{
		{"below default minimum volume", Config{}, 0, 99, Closed},
		{"49 percent", Config{}, 51, 49, Closed},
		{"50 percent", Config{}, 50, 50, Open},
		{"minimum 20, below minimum volume", Config{MinimumCalls: 20}, 0, 19, Closed},
		{"minimum 20, 10 of 20", Config{MinimumCalls: 20}, 10, 10, Open},
		{"minimum 20, 9 of 20", Config{MinimumCalls: 20}, 11, 9, Closed},
		{"threshold 0.3, 3 of 10", Config{FailureThreshold: 0.3, MinimumCalls: 10}, 7, 3, Open},
		{"threshold 0.3, 2 of 10", Config{FailureThreshold: 0.3, MinimumCalls: 10}, 8, 2, Closed},
		{"threshold 1, 99 of 100", Config{FailureThreshold: 1}, 1, 99, Closed},
		{"threshold 1, all", Config{FailureThreshold: 1}, 0, 100, Open},
		{"minimum 1", Config{MinimumCalls: 1}, 0, 1, Open},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := newTest(t, tc.cfg)
			calls(t, b, tc.successes, Success)
			calls(t, b, tc.failures, Failure)
			wantState(t, b, tc.want)
		})
	}
}

func TestSuccessNeverOpens(t *testing.T) {
	// The rate is evaluated when a failure is recorded: 50 failures in 99
	// calls, then a success, leaves the breaker closed until the next
	// failure.
	b, _ := newTest(t, Config{})
	calls(t, b, 49, Success)
	calls(t, b, 50, Failure)
	call(t, b, Success)
	wantState(t, b, Closed)
	call(t, b, Failure)
	wantState(t, b, Open)
}

func TestWindowSlides(t *testing.T) {
	b, clk := newTest(t, Config{MinimumCalls: 20})
	calls(t, b, 15, Failure)
	if s := b.Snapshot(); s.Calls != 15 || s.Failures != 15 {
		t.Fatalf("got calls %d failures %d, want 15 15", s.Calls, s.Failures)
	}
	clk.Advance(DefaultWindow) // the 15 failures leave the window
	if s := b.Snapshot(); s.Calls != 0 {
		t.Fatalf("after a window: got %d calls, want 0", s.Calls)
	}
	calls(t, b, 15, Failure)
	wantState(t, b, Closed)

	// Within the window buckets add up: 15 + 5 failures spread over 9 s.
	clk.Advance(9 * time.Second)
	calls(t, b, 4, Failure)
	wantState(t, b, Closed)
	call(t, b, Failure)
	wantState(t, b, Open)
}

func TestTransitions(t *testing.T) {
	var got []transition
	b, clk := newTest(t, Config{OnStateChange: func(_ string, from, to State) {
		got = append(got, transition{from, to})
	}})

	trip(t, b)
	clk.Advance(time.Second - 1)
	if call(t, b, Success) {
		t.Fatal("call allowed 1ns before the open interval ends")
	}
	wantState(t, b, Open)

	clk.Advance(1)
	calls(t, b, 2, Success)
	wantState(t, b, HalfOpen)
	call(t, b, Failure) // open again, for 2 s
	wantState(t, b, Open)

	clk.Advance(2 * time.Second)
	calls(t, b, DefaultHalfOpenProbes, Success)
	wantState(t, b, Closed)
	if s := b.Snapshot(); s.Calls != 0 || s.Failures != 0 || s.ConsecutiveFailures != 0 {
		t.Fatalf("after closing: got %+v, want an empty window", s)
	}
	if s := b.Snapshot(); s.OpenInterval != time.Second || s.TimesOpened != 2 {
		t.Fatalf("after closing: got interval %v opened %d, want 1s 2", s.OpenInterval, s.TimesOpened)
	}

	want := []transition{
		{Closed, Open}, {Open, HalfOpen}, {HalfOpen, Open},
		{Open, HalfOpen}, {HalfOpen, Closed},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got transitions %v, want %v", got, want)
	}
}

func TestOpenIntervalGrowsAndIsCapped(t *testing.T) {
	b, clk := newTest(t, Config{OpenInterval: time.Second, MaxOpenInterval: 10 * time.Second})
	trip(t, b)
	for i, want := range []time.Duration{1, 2, 4, 8, 10, 10, 10} {
		want *= time.Second
		if got := b.Snapshot().OpenInterval; got != want {
			t.Fatalf("trip %d: got interval %v, want %v", i, got, want)
		}
		clk.Advance(want - 1)
		if call(t, b, Failure) {
			t.Fatalf("trip %d: allowed %v after opening, want open for %v", i, want-1, want)
		}
		clk.Advance(1)
		call(t, b, Failure) // the probe fails: open again, longer
		wantState(t, b, Open)
	}
	// Closing resets the interval.
	clk.Advance(10 * time.Second)
	calls(t, b, DefaultHalfOpenProbes, Success)
	wantState(t, b, Closed)
	trip(t, b)
	if got := b.Snapshot().OpenInterval; got != time.Second {
		t.Fatalf("after closing and tripping: got interval %v, want 1s", got)
	}
}

// The open interval doubles up to MaxOpenInterval, the largest allowed
// (MaxInterval) too.
func TestOpenIntervalNoOverflow(t *testing.T) {
	huge := MaxInterval
	b, clk := newTest(t, Config{OpenInterval: huge / 3, MaxOpenInterval: huge, Jitter: NoJitter})
	trip(t, b)
	clk.Advance(huge / 3)
	call(t, b, Failure)
	if got := b.Snapshot().OpenInterval; got != huge/3*2 {
		t.Fatalf("got %v, want %v", got, huge/3*2)
	}
	clk.Advance(huge / 3 * 2)
	call(t, b, Failure)
	if got := b.Snapshot().OpenInterval; got != huge {
		t.Fatalf("got %v, want %v", got, huge)
	}
	wantState(t, b, Open)
}

func TestJittered(t *testing.T) {
	const d = time.Second
	for _, tc := range []struct {
		j, u float64
		want time.Duration
	}{
		{0.2, 0, 800 * time.Millisecond},
		{0.2, 0.25, 900 * time.Millisecond},
		{0.2, 0.5, time.Second},
		{0.2, 0.75, 1100 * time.Millisecond},
		{0.5, 0, 500 * time.Millisecond},
		{NoJitter, 0, time.Second},
		{NoJitter, 0.99, time.Second},
		{0.2, -3, 800 * time.Millisecond}, // clamped
		{0.2, 7, 1200 * time.Millisecond}, // clamped
		{0.2, math.NaN(), 800 * time.Millisecond},
	} {
		if got := jittered(d, tc.j, tc.u); got != tc.want {
			t.Errorf("jittered(%v, %v, %v): got %v, want %v", d, tc.j, tc.u, got, tc.want)
		}
	}
}

func TestJitterBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, d := range []time.Duration{time.Second, 30 * time.Second, 7} {
		lo, hi := time.Duration(float64(d)*0.8), time.Duration(float64(d)*1.2)
		for range 10000 {
			if got := jittered(d, DefaultJitter, r.Float64()); got < lo || got > hi {
				t.Fatalf("jittered(%v): got %v, want within [%v, %v]", d, got, lo, hi)
			}
		}
	}
}

func TestJitterInBreaker(t *testing.T) {
	for _, tc := range []struct {
		u    float64
		want time.Duration // how long the breaker stays open
	}{
		{0, 800 * time.Millisecond},
		{0.5, time.Second},
		{0.75, 1100 * time.Millisecond},
	} {
		b, clk := newTest(t, Config{Rand: func() float64 { return tc.u }})
		trip(t, b)
		clk.Advance(tc.want - 1)
		if call(t, b, Success) {
			t.Fatalf("u=%v: allowed after %v, want open for %v", tc.u, tc.want-1, tc.want)
		}
		clk.Advance(1)
		if !call(t, b, Success) {
			t.Fatalf("u=%v: rejected after %v, want open for %v", tc.u, tc.want, tc.want)
		}
	}
}

// halfOpen returns a breaker that the next Allow makes half-open.
func halfOpen(t *testing.T, cfg Config) (*Breaker, *clock.Fake) {
	t.Helper()
	b, clk := newTest(t, cfg)
	trip(t, b)
	clk.Advance(time.Second)
	return b, clk
}

func TestProbeLimit(t *testing.T) {
	b, _ := halfOpen(t, Config{})
	var ps []Permit
	for range DefaultHalfOpenProbes {
		p, err := b.Allow()
		if err != nil {
			t.Fatalf("probe: got %v, want a permit", err)
		}
		ps = append(ps, p)
	}
	if _, err := b.Allow(); !errors.Is(err, ErrOpen) {
		t.Fatalf("probe %d: got %v, want ErrOpen", DefaultHalfOpenProbes+1, err)
	}
	ps[0].Done(Success) // frees a slot
	wantState(t, b, HalfOpen)
	p, err := b.Allow()
	if err != nil {
		t.Fatalf("after a probe is done: got %v, want a permit", err)
	}
	ps[1].Done(Success)
	ps[2].Done(Success)
	wantState(t, b, Closed)
	p.Done(Failure) // from the half-open period: ignored
	wantState(t, b, Closed)
	if s := b.Snapshot(); s.Calls != 0 {
		t.Fatalf("late probe result counted: got %d calls, want 0", s.Calls)
	}
}

func TestPermitProbe(t *testing.T) {
	b, _ := newTest(t, Config{})
	p, err := b.Allow()
	if err != nil || p.Probe() {
		t.Fatalf("closed: got probe=%v, err %v; want a non-probe permit", p.Probe(), err)
	}
	p.Done(Success)
	if (Permit{}).Probe() {
		t.Fatal("the zero Permit is a probe")
	}
	b, _ = halfOpen(t, Config{})
	p, err = b.Allow()
	if err != nil || !p.Probe() {
		t.Fatalf("half-open: got probe=%v, err %v; want a probe", p.Probe(), err)
	}
	p.Done(Success)
}

func TestProbeLimitConcurrent(t *testing.T) {
	const goroutines = 64
	for _, probes := range []int{1, 3, 10} {
		b, _ := halfOpen(t, Config{HalfOpenProbes: probes})
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			granted atomic.Int64
		)
		for range goroutines {
			wg.Go(func() {
				<-start
				if _, err := b.Allow(); err == nil {
					granted.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if got := granted.Load(); got != int64(probes) {
			t.Errorf("HalfOpenProbes %d: got %d permits, want %d", probes, got, probes)
		}
		wantState(t, b, HalfOpen)
	}
}

func TestIgnored(t *testing.T) {
	t.Run("closed", func(t *testing.T) {
		b, _ := newTest(t, Config{ConsecutiveFailures: 2})
		call(t, b, Failure)
		calls(t, b, 100, Ignored)
		calls(t, b, 5, Outcome(42)) // unknown outcomes count nothing
		s := b.Snapshot()
		if s.Calls != 1 || s.Failures != 1 || s.ConsecutiveFailures != 1 {
			t.Fatalf("got %+v, want 1 call, 1 failure, 1 consecutive", s)
		}
	})
	t.Run("half-open", func(t *testing.T) {
		b, _ := halfOpen(t, Config{HalfOpenProbes: 1})
		for range 5 {
			calls(t, b, 1, Ignored) // frees the only slot each time
			wantState(t, b, HalfOpen)
		}
		calls(t, b, 1, Success)
		wantState(t, b, Closed)
	})
}

func TestStaleResults(t *testing.T) {
	t.Run("closed permit after opening", func(t *testing.T) {
		b, clk := newTest(t, Config{})
		late, _ := b.Allow()
		trip(t, b)
		late.Done(Failure)
		if got := b.Snapshot().Failures; got != 100 {
			t.Fatalf("got %d failures, want the 100 that opened it", got)
		}
		clk.Advance(time.Second)
		calls(t, b, 3, Success)
		wantState(t, b, Closed)
		late.Done(Failure)
		if s := b.Snapshot(); s.Calls != 0 || s.ConsecutiveFailures != 0 {
			t.Fatalf("late result counted: got %+v", s)
		}
	})
	t.Run("probe after reopening", func(t *testing.T) {
		b, clk := halfOpen(t, Config{})
		p1, _ := b.Allow()
		p2, _ := b.Allow()
		p1.Done(Failure)
		wantState(t, b, Open)
		p2.Done(Success) // ignored, and must not free a slot of a later period
		clk.Advance(2 * time.Second)
		var ps []Permit
		for range DefaultHalfOpenProbes {
			p, err := b.Allow()
			if err != nil {
				t.Fatalf("new half-open period: got %v, want a permit", err)
			}
			ps = append(ps, p)
		}
		p2.Done(Success)
		p2.Done(Ignored)
		if _, err := b.Allow(); !errors.Is(err, ErrOpen) {
			t.Fatalf("stale probe freed a slot: got %v, want ErrOpen", err)
		}
		for _, p := range ps {
			p.Done(Success)
		}
		wantState(t, b, Closed)
	})
}

// TestZeroPermit: the zero Permit that Allow returns with ErrOpen is no
// probe, and reporting any outcome on it changes nothing: it neither frees
// a probe slot nor counts towards closing or reopening the breaker.
func TestZeroPermit(t *testing.T) {
	b, clk := newTest(t, Config{MinimumCalls: 1, HalfOpenProbes: 2})
	trip(t, b)
	p, err := b.Allow()
	if err == nil || p != (Permit{}) || p.Probe() {
		t.Fatalf("Allow on an open breaker: got %+v, %v; want the zero Permit and ErrOpen", p, err)
	}
	p.Done(Failure) // must not count as a failed probe, nor reopen
	clk.Advance(time.Second)
	probe1, err1 := b.Allow()
	probe2, err2 := b.Allow()
	if err1 != nil || err2 != nil || !probe1.Probe() || !probe2.Probe() {
		t.Fatalf("after the open interval: got %v, %v; want two probes", err1, err2)
	}
	refused, err := b.Allow()
	if err == nil {
		t.Fatal("a third probe was let through with HalfOpenProbes 2")
	}
	for range 3 {
		refused.Done(Success) // must not free a slot, nor count a success
		refused.Done(Ignored)
	}
	if _, err := b.Allow(); err == nil {
		t.Fatal("the zero Permit's Done freed a probe slot")
	}
	wantState(t, b, HalfOpen)
	probe1.Done(Success)
	wantState(t, b, HalfOpen) // one success of two: the zero Permit's did not count
	probe2.Done(Success)
	wantState(t, b, Closed)
}

func TestConsecutiveFailures(t *testing.T) {
	b, _ := newTest(t, Config{ConsecutiveFailures: 3, MinimumCalls: 1000})
	calls(t, b, 2, Failure)
	call(t, b, Success) // resets the run
	calls(t, b, 2, Failure)
	wantState(t, b, Closed)
	if got := b.Snapshot().ConsecutiveFailures; got != 2 {
		t.Fatalf("got %d consecutive failures, want 2", got)
	}
	call(t, b, Failure)
	wantState(t, b, Open)

	// Off by default: 100 failures below the minimum volume do not open.
	b, _ = newTest(t, Config{MinimumCalls: 1000})
	calls(t, b, 100, Failure)
	wantState(t, b, Closed)
}

func TestClockGoesBack(t *testing.T) {
	b, clk := newTest(t, Config{MinimumCalls: 20})
	clk.Advance(5 * time.Second)
	calls(t, b, 10, Failure)
	clk.Advance(-time.Hour)
	calls(t, b, 9, Failure)
	wantState(t, b, Closed)
	if got := b.Snapshot().Calls; got != 19 {
		t.Fatalf("got %d calls, want 19", got)
	}
	call(t, b, Failure)
	wantState(t, b, Open)
	clk.Advance(time.Hour + time.Second)
	call(t, b, Success)
	wantState(t, b, HalfOpen)
}

func TestConfigValidation(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name  string
		cfg   Config
		field string // empty: valid
	}{
		{"zero", Config{}, ""},
		{"threshold 1", Config{FailureThreshold: 1}, ""},
		{"threshold tiny", Config{FailureThreshold: 1e-9}, ""},
		{"threshold negative", Config{FailureThreshold: -0.5}, "FailureThreshold"},
		{"threshold above 1", Config{FailureThreshold: 1.01}, "FailureThreshold"},
		{"threshold NaN", Config{FailureThreshold: nan}, "FailureThreshold"},
		{"threshold Inf", Config{FailureThreshold: math.Inf(1)}, "FailureThreshold"},
		{"minimum calls negative", Config{MinimumCalls: -1}, "MinimumCalls"},
		{"window negative", Config{Window: -time.Second}, "Window"},
		{"window too short", Config{Window: 999 * time.Millisecond}, "Window"},
		{"window 1s", Config{Window: time.Second}, ""},
		{"consecutive negative", Config{ConsecutiveFailures: -3}, "ConsecutiveFailures"},
		{"open interval negative", Config{OpenInterval: -1}, "OpenInterval"},
		{"max open interval negative", Config{MaxOpenInterval: -1}, "MaxOpenInterval"},
		{"max below open", Config{OpenInterval: 2 * time.Second, MaxOpenInterval: time.Second}, "MaxOpenInterval"},
		{"max below default open", Config{MaxOpenInterval: time.Millisecond}, "MaxOpenInterval"},
		{"open above default max", Config{OpenInterval: time.Minute}, ""},
		{"jitter negative", Config{Jitter: -0.1}, "Jitter"},
		{"jitter 1", Config{Jitter: 1}, "Jitter"},
		{"jitter NaN", Config{Jitter: nan}, "Jitter"},
		{"no jitter", Config{Jitter: NoJitter}, ""},
		{"probes negative", Config{HalfOpenProbes: -1}, "HalfOpenProbes"},
		// Nonsense that never opens, or never closes (a new-user trial:
		// accepted before).
		{"minimum calls huge", Config{MinimumCalls: 1 << 40}, "MinimumCalls"},
		{"minimum calls max", Config{MinimumCalls: MaxCalls}, ""},
		{"consecutive huge", Config{ConsecutiveFailures: 1 << 40}, "ConsecutiveFailures"},
		{"window huge", Config{Window: 1000 * time.Hour}, "Window"},
		{"window max", Config{Window: MaxWindow}, ""},
		{"open interval huge", Config{OpenInterval: 1000 * time.Hour}, "OpenInterval"},
		{"max open interval huge", Config{MaxOpenInterval: 1000 * time.Hour}, "MaxOpenInterval"},
		{"intervals max", Config{OpenInterval: MaxInterval, MaxOpenInterval: MaxInterval}, ""},
		{"probes huge", Config{HalfOpenProbes: 1 << 40}, "HalfOpenProbes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(tc.cfg)
			if tc.field == "" {
				if err != nil || b == nil {
					t.Fatalf("got %v, want no error", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got %v, want an error wrapping ErrInvalidConfig", err)
			}
			if b != nil {
				t.Fatalf("got a breaker with error %v", err)
			}
			if !containsWord(err.Error(), tc.field) {
				t.Fatalf("got %q, want it to name %s", err, tc.field)
			}
		})
	}
}

func containsWord(s, w string) bool {
	for i := 0; i+len(w) <= len(s); i++ {
		if s[i:i+len(w)] == w && (i+len(w) == len(s) || s[i+len(w)] == ' ') {
			return true
		}
	}
	return false
}

func TestDefaults(t *testing.T) {
	c, err := Config{}.normalize()
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		FailureThreshold: 0.5, MinimumCalls: 100, Window: 10 * time.Second,
		OpenInterval: time.Second, MaxOpenInterval: 30 * time.Second,
		Jitter: 0.2, HalfOpenProbes: 3,
	}
	if c.FailureThreshold != want.FailureThreshold || c.MinimumCalls != want.MinimumCalls ||
		c.Window != want.Window || c.ConsecutiveFailures != 0 ||
		c.OpenInterval != want.OpenInterval || c.MaxOpenInterval != want.MaxOpenInterval ||
		c.Jitter != want.Jitter || c.HalfOpenProbes != want.HalfOpenProbes {
		t.Fatalf("got %+v, want %+v", c, want)
	}
	c, _ = Config{OpenInterval: time.Minute}.normalize()
	if c.MaxOpenInterval != time.Minute {
		t.Fatalf("OpenInterval 1m: got MaxOpenInterval %v, want 1m", c.MaxOpenInterval)
	}
	b, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if !b.mono || b.cfg.Rand == nil {
		t.Fatalf("nil Clock and Rand: got mono %v, rand %v; want the system clock and a rand", b.mono, b.cfg.Rand != nil)
	}
}

func TestOnStateChangeWithoutLock(t *testing.T) {
	var (
		got  []transition
		snap []State
		b    *Breaker
	)
	b, clk := newTest(t, Config{OnStateChange: func(name string, from, to State) {
		if name != "payments" {
			t.Errorf("got name %q, want payments", name)
		}
		got = append(got, transition{from, to})
		snap = append(snap, b.Snapshot().State) // must not deadlock
		if p, err := b.Allow(); err == nil {    // nor this, which may change state
			p.Done(Success)
		}
	}, Name: "payments", HalfOpenProbes: 1})

	trip(t, b) // the callback's Allow is rejected
	clk.Advance(time.Second)
	// This Allow makes the breaker half-open and takes the only probe
	// slot; the callback's Allow is rejected.
	p, err := b.Allow()
	if err != nil {
		t.Fatalf("got %v, want a probe permit", err)
	}
	p.Done(Success) // closes; the callback's call counts as closed success

	want := []transition{{Closed, Open}, {Open, HalfOpen}, {HalfOpen, Closed}}
	if !slices.Equal(got, want) {
		t.Fatalf("got transitions %v, want %v", got, want)
	}
	if wantSnap := []State{Open, HalfOpen, Closed}; !slices.Equal(snap, wantSnap) {
		t.Fatalf("got states seen from the callback %v, want %v", snap, wantSnap)
	}
	if got := b.Snapshot().Calls; got != 1 {
		t.Fatalf("got %d calls, want the callback's 1", got)
	}
}

func TestOnStateChangeReentrantOrder(t *testing.T) {
	// A callback whose own call changes the state: the change it causes is
	// reported after the one being reported, not inside it.
	var (
		got   []transition
		depth int
		b     *Breaker
		clk   = clock.NewFake(t0)
	)
	b, err := New(Config{Clock: clk, Rand: half, HalfOpenProbes: 1, OnStateChange: func(_ string, from, to State) {
		depth++
		defer func() { depth-- }()
		if depth > 1 {
			t.Errorf("callback re-entered for %v -> %v", from, to)
		}
		got = append(got, transition{from, to})
		if to == Open && len(got) < 7 {
			clk.Advance(time.Minute)
			call(t, b, Failure) // half-open, then open again
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	trip(t, b)
	if n := len(got); n != 7 {
		t.Fatalf("got %d transitions, want 7", n)
	}
	for i, tr := range got {
		var want transition
		switch {
		case i == 0:
			want = transition{Closed, Open}
		case i%2 == 1:
			want = transition{Open, HalfOpen}
		default:
			want = transition{HalfOpen, Open}
		}
		if tr != want {
			t.Fatalf("transition %d: got %v, want %v", i, tr, want)
		}
	}
}

func TestOnStateChangePanic(t *testing.T) {
	var n int
	b, clk := newTest(t, Config{OnStateChange: func(_ string, from, to State) {
		n++
		if to == Open {
			panic("boom")
		}
	}})
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("got panic %v, want boom", r)
			}
		}()
		trip(t, b)
	}()
	clk.Advance(time.Second)
	calls(t, b, 3, Success)
	if n != 3 {
		t.Fatalf("got %d callbacks, want 3 (later changes still reported)", n)
	}
}

// TestRandomFailuresDoNotOpen is the requirement on the defaults: random
// failures at 30 % must not open the breaker. The seeds are simply 0 to
// 19, not chosen; each run is a fresh breaker (whose first window holds
// the fewest calls, the riskiest moment) followed by 100 s at 1000
// calls/s. At 100 calls, 50 % failures are 4.4 standard deviations above
// 30 %; TestMinimumCallsAgainstNoise measures how often the old default
// of 20 failed this.
func TestRandomFailuresDoNotOpen(t *testing.T) {
	const (
		seeds = 20
		n     = 100_000
	)
	for seed := range uint64(seeds) {
		t.Run("seed "+strconv.FormatUint(seed, 10), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(seed, 30))
			b, clk := newTest(t, Config{})
			failed := 0
			for i := range n {
				o := Success
				if r.Float64() < 0.3 {
					o = Failure
					failed++
				}
				if !call(t, b, o) {
					t.Fatalf("call %d: breaker opened at 30 %% failures: %+v", i, b.Snapshot())
				}
				clk.Advance(time.Millisecond) // 1000 calls/s
			}
			if got := b.Snapshot().TimesOpened; got != 0 {
				t.Fatalf("got opened %d times, want 0", got)
			}
			if rate := float64(failed) / n; rate < 0.29 || rate > 0.31 {
				t.Fatalf("got failure rate %.3f, want about 0.3", rate)
			}
		})
	}
}

// TestMinimumCallsAgainstNoise documents why MinimumCalls 20, the default
// of the original design, was wrong and 100 is the default: with 30 %
// random failures, a fresh breaker at MinimumCalls 20 opens within its
// first calls in about 6 % of runs (P(at least 10 of 20 fail) alone is
// 4.8 %); at MinimumCalls 100 none of the runs opens.
func TestMinimumCallsAgainstNoise(t *testing.T) {
	const runs = 2000
	for _, tc := range []struct {
		minimum int
		lo, hi  int // expected runs that open, out of runs
	}{
		{20, runs * 3 / 100, runs * 9 / 100},
		{100, 0, 0},
	} {
		t.Run("MinimumCalls "+strconv.Itoa(tc.minimum), func(t *testing.T) {
			t.Parallel()
			opened := 0
			for seed := range uint64(runs) {
				r := rand.New(rand.NewPCG(seed, 30))
				b, clk := newTest(t, Config{MinimumCalls: tc.minimum})
				for range 300 {
					o := Success
					if r.Float64() < 0.3 {
						o = Failure
					}
					if !call(t, b, o) {
						opened++
						break
					}
					clk.Advance(time.Millisecond)
				}
			}
			if opened < tc.lo || opened > tc.hi {
				t.Errorf("%d of %d fresh breakers opened at 30 %%, want %d to %d",
					opened, runs, tc.lo, tc.hi)
			}
			t.Logf("%d of %d fresh breakers opened at 30 %%", opened, runs)
		})
	}
	if DefaultMinimumCalls != 100 {
		t.Errorf("DefaultMinimumCalls is %d; the noise measured here was for 100", DefaultMinimumCalls)
	}
}

func TestStress(t *testing.T) {
	const (
		goroutines = 8
		perG       = 5000
		probes     = 3
		hold       = 4 // permits a goroutine holds at once
	)
	var (
		mu       sync.Mutex
		inFlight = map[uint64]int{} // probes held, per half-open period
		maxSeen  int
		changes  atomic.Int64
	)
	b, clk := newTest(t, Config{
		HalfOpenProbes: probes, Rand: rand.Float64, MinimumCalls: 10,
		OnStateChange: func(string, State, State) { changes.Add(1) },
	})
	// Each goroutine holds up to hold permits and reports a random one
	// when it has that many, so probes overlap within one goroutine and
	// across goroutines. A probe is counted from after Allow to before
	// Done, a subset of the time the breaker holds its slot, so the count
	// can never exceed a correct limit; a broken limit shows as soon as a
	// goroutine asks for one probe more than the limit while holding its
	// own.
	release := func(p Permit, o Outcome) {
		if stateOf(p.word) == HalfOpen {
			mu.Lock()
			inFlight[p.word]--
			mu.Unlock()
		}
		p.Done(o)
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			var held []Permit
			for range perG {
				if r.IntN(50) == 0 {
					clk.Advance(time.Duration(r.IntN(3000)) * time.Millisecond)
				}
				p, err := b.Allow()
				if err == nil {
					if stateOf(p.word) == HalfOpen {
						mu.Lock()
						inFlight[p.word]++
						maxSeen = max(maxSeen, inFlight[p.word])
						mu.Unlock()
					}
					held = append(held, p)
				}
				if len(held) == hold || err != nil && len(held) > 0 {
					i := r.IntN(len(held))
					release(held[i], Outcome(r.IntN(3)))
					held = slices.Delete(held, i, i+1)
				}
				_ = b.Snapshot()
			}
			for _, p := range held {
				release(p, Outcome(r.IntN(3)))
			}
		})
	}
	wg.Wait()
	if maxSeen > probes {
		t.Fatalf("got %d concurrent probes in one half-open period, want at most %d", maxSeen, probes)
	}
	s := b.Snapshot()
	if s.TimesOpened == 0 || maxSeen == 0 {
		t.Fatalf("breaker never opened or never probed under 1/3 failures with MinimumCalls 10: %+v, %d probes at most", s, maxSeen)
	}
	t.Logf("final %+v, %d state changes, %d concurrent probes at most", s, changes.Load(), maxSeen)
}

// TestClockBackKeepsOutcomes: outcomes recorded after the clock went back
// count in the newest bucket, even when their slot of the ring holds an
// older turn.
func TestClockBackKeepsOutcomes(t *testing.T) {
	b, clk := newTest(t, Config{MinimumCalls: 20})
	clk.Advance(25*time.Second + 500*time.Millisecond)
	calls(t, b, 1, Success)        // bucket 25
	clk.Advance(-12 * time.Second) // 13.5 s: its slot holds an older turn
	for range 30 {
		if !call(t, b, Failure) {
			break
		}
	}
	if s := b.Snapshot(); b.State() != Open || s.TimesOpened != 1 {
		t.Fatalf("failures after the clock went back were lost: state %v, %+v", b.State(), s)
	}
}
