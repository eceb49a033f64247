package breaker

import (
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

func newTestSet(t *testing.T, cfg Config, maxKeys int) (*Set, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	cfg.Clock = clk
	cfg.Rand = half
	s, err := NewSet(cfg, maxKeys)
	if err != nil {
		t.Fatalf("NewSet: %v", err)
	}
	return s, clk
}

func keysOf(s *Set) []string {
	var keys []string
	s.Range(func(k string, _ *Breaker) bool {
		keys = append(keys, k)
		return true
	})
	slices.Sort(keys)
	return keys
}

func wantKeys(t *testing.T, s *Set, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := keysOf(s); !slices.Equal(got, want) {
		t.Fatalf("got keys %v, want %v", got, want)
	}
	if got := s.Len(); got != len(want) {
		t.Fatalf("got Len %d, want %d", got, len(want))
	}
}

func TestSetSameKey(t *testing.T) {
	var names []string
	s, _ := newTestSet(t, Config{Name: "ignored", OnStateChange: func(name string, _, _ State) {
		names = append(names, name)
	}}, 0)
	a, b := s.Get("a"), s.Get("b")
	if a == b {
		t.Fatal("got the same breaker for different keys")
	}
	if got := s.Get("a"); got != a {
		t.Fatal("got a new breaker for an existing key")
	}
	if got := a.Name(); got != "a" {
		t.Fatalf("got name %q, want a", got)
	}
	trip(t, a)
	if !slices.Equal(names, []string{"a"}) {
		t.Fatalf("got OnStateChange names %v, want [a]", names)
	}
	snap := s.Snapshot()
	if len(snap) != 2 || snap["a"].State != Open || snap["b"].State != Closed || snap["a"].Name != "a" {
		t.Fatalf("got snapshot %+v, want a open, b closed", snap)
	}
}

func TestSetBound(t *testing.T) {
	s, _ := newTestSet(t, Config{}, 4)
	for i := range 1000 {
		s.Get(strconv.Itoa(i))
		if got := s.Len(); got > 4 {
			t.Fatalf("after %d keys: got Len %d, want at most 4", i+1, got)
		}
	}
	wantKeys(t, s, "996", "997", "998", "999")

	d, err := NewSet(Config{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.m.Max != DefaultMaxKeys {
		t.Fatalf("maxKeys 0: got %d, want %d", d.m.Max, DefaultMaxKeys)
	}
}

func TestSetEviction(t *testing.T) {
	t.Run("least recently used closed breaker", func(t *testing.T) {
		s, _ := newTestSet(t, Config{}, 3)
		s.Get("a")
		s.Get("b")
		s.Get("c")
		s.Get("d") // none was used since insertion: the hand takes a
		wantKeys(t, s, "b", "c", "d")
		s.Get("b") // b gets a second chance, c does not
		s.Get("e")
		wantKeys(t, s, "b", "d", "e")
	})
	t.Run("open breakers are kept", func(t *testing.T) {
		s, _ := newTestSet(t, Config{}, 3)
		trip(t, s.Get("a"))
		trip(t, s.Get("b"))
		s.Get("c")
		for _, k := range []string{"d", "e", "f", "g"} {
			s.Get(k) // evicts the closed one each time
		}
		wantKeys(t, s, "a", "b", "g")
	})
	t.Run("half-open breakers are kept", func(t *testing.T) {
		s, clk := newTestSet(t, Config{}, 2)
		a := s.Get("a")
		trip(t, a)
		clk.Advance(2 * 1e9)
		p, err := a.Allow()
		if err != nil {
			t.Fatal(err)
		}
		defer p.Done(Ignored)
		wantState(t, a, HalfOpen)
		s.Get("b")
		s.Get("c")
		wantKeys(t, s, "a", "c")
	})
	t.Run("all open", func(t *testing.T) {
		s, _ := newTestSet(t, Config{}, 2)
		a, b := s.Get("a"), s.Get("b")
		trip(t, a)
		trip(t, b)
		c := s.Get("c") // evicts one of the open ones: a, under the hand
		wantKeys(t, s, "b", "c")
		// The evicted breaker still works for its holder; the set forgets it.
		wantState(t, a, Open)
		if got := s.Get("a"); got == a || got.State() != Closed {
			t.Fatalf("got the evicted breaker back or not closed: state %v", got.State())
		}
		_ = c
	})
}

func TestSetConcurrent(t *testing.T) {
	const goroutines = 16
	t.Run("same key, same breaker", func(t *testing.T) {
		s, _ := newTestSet(t, Config{}, 0)
		got := make([]*Breaker, goroutines)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				<-start
				got[g] = s.Get("k")
			})
		}
		close(start)
		wg.Wait()
		for g, b := range got {
			if b != got[0] {
				t.Fatalf("goroutine %d got a different breaker", g)
			}
		}
	})
	t.Run("churn", func(t *testing.T) {
		const maxKeys = 8
		s, _ := newTestSet(t, Config{MinimumCalls: 5}, maxKeys)
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for i := range 2000 {
					key := strconv.Itoa((g*7 + i) % 40)
					p, err := s.Get(key).Allow()
					if err == nil {
						p.Done(Outcome(i % 3))
					} else if !errors.Is(err, ErrOpen) {
						t.Errorf("got %v, want ErrOpen", err)
						return
					}
					if i%100 == 0 {
						_ = s.Snapshot()
						if n := s.Len(); n > maxKeys {
							t.Errorf("got Len %d, want at most %d", n, maxKeys)
						}
					}
				}
			})
		}
		wg.Wait()
		if n, keys := s.Len(), keysOf(s); n > maxKeys || len(keys) != n {
			t.Fatalf("got Len %d and keys %v, want the same count, at most %d", n, keys, maxKeys)
		}
	})
}

func TestNewSetValidation(t *testing.T) {
	if _, err := NewSet(Config{}, -1); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("maxKeys -1: got %v, want ErrInvalidConfig", err)
	}
	if _, err := NewSet(Config{Window: 1}, 10); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("bad config: got %v, want ErrInvalidConfig", err)
	}
}

// TestSetNeverEvictsOpenWhileClosedExist: busy closed keys whose used bits
// are set again between the hand's two rounds must not make the set evict
// the open breaker instead.
func TestSetNeverEvictsOpenWhileClosedExist(t *testing.T) {
	s, _ := newTestSet(t, Config{ConsecutiveFailures: 1}, 4)
	dead := s.Get("dead")
	p, _ := dead.Allow()
	p.Done(Failure)
	wantState(t, dead, Open)
	for i := range 3 {
		s.Get("hot" + strconv.Itoa(i))
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for !stop.Load() {
				s.Range(func(k string, _ *Breaker) bool {
					if k != "dead" {
						s.Get(k) // every closed key in the set is in use
					}
					return true
				})
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()
	for i := range 20000 {
		s.Get("new" + strconv.Itoa(i))
		if v, ok := s.m.Load("dead"); !ok || v != dead {
			t.Fatalf("after %d inserts the open breaker was evicted while closed ones were in the set", i+1)
		}
	}
}

// TestSetHotKeySurvivesFlood: a key used all along stays in a full set
// while 5 000 one-off keys pass through it. Before the fix new entries
// started as used, so the flood left every entry used; the hand cleared
// them all in one round and evicted whatever it stood on: the hot key,
// at the first insert past the bound.
func TestSetHotKeySurvivesFlood(t *testing.T) {
	s, _ := newTestSet(t, Config{}, 0)
	hot := s.Get("hot")
	for i := range 5000 {
		s.Get("once" + strconv.Itoa(i))
		if i%10 == 0 && s.Get("hot") != hot {
			t.Fatalf("after %d one-off keys the hot key was evicted", i+1)
		}
		if n := s.Len(); n > DefaultMaxKeys {
			t.Fatalf("got Len %d, want at most %d", n, DefaultMaxKeys)
		}
	}
	if got := s.Get("hot"); got != hot {
		t.Fatal("after the flood the hot key was evicted")
	}
}

// An open breaker whose interval ended long ago, and which no one has
// called since (its target is gone), may be evicted from a full Set; the
// live closed breakers keep their windows.
func TestSetEvictsStaleOpen(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	s, _ := NewSet(Config{Clock: fc, MinimumCalls: 1}, 2)
	p, _ := s.Get("gone").Allow()
	p.Done(Failure)
	if s.Get("gone").State() != Open {
		t.Fatal("setup: not open")
	}
	fc.Advance(24 * time.Hour)
	a := s.Get("a")
	s.Get("a")
	s.Get("b")
	s.Get("b")
	if s.Get("a") != a {
		t.Error("a live closed breaker was evicted while a stale open one was kept")
	}
	// Within its interval an open breaker is never evicted.
	s2, _ := NewSet(Config{Clock: fc, MinimumCalls: 1}, 2)
	p, _ = s2.Get("down").Allow()
	p.Done(Failure)
	down := s2.Get("down")
	for _, k := range []string{"x", "y", "z"} {
		s2.Get(k)
	}
	if s2.Get("down") != down {
		t.Error("an open breaker within its interval was evicted")
	}
}

// A zero Set is usable, with the defaults: its breakers used to panic
// (integer divide by zero) at the first Done (a user's trial).
func TestZeroSet(t *testing.T) {
	var s Set
	b := s.Get("x")
	for range DefaultMinimumCalls {
		if p, err := b.Allow(); err == nil {
			p.Done(Failure)
		}
	}
	if b.State() != Open {
		t.Errorf("after %d failures: %v, want open (the defaults)", DefaultMinimumCalls, b.State())
	}
	if s.Get("x") != b || s.Get("y") == b || s.Len() != 2 {
		t.Errorf("Get: len %d, want one breaker per key", s.Len())
	}
}

// A zero Set's Config has the defaults filled in, before any Get too, and
// races with none (a review: it read the config without the set-up).
func TestZeroSetConfig(t *testing.T) {
	var s Set
	if got := s.Config(); got.MinimumCalls != DefaultMinimumCalls {
		t.Errorf("zero Set's Config before Get: MinimumCalls %d, want %d", got.MinimumCalls, DefaultMinimumCalls)
	}
	var z Set
	done := make(chan struct{})
	go func() { z.Get("x"); close(done) }()
	_ = z.Config()
	<-done
}
