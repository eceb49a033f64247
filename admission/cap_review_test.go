package admission

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

// The regressions of the review of 2026-12-05, each failing on the code
// before its fix.

// MaxInFlight holds while the server is suspect too: the suspect phase's
// cap (twice the completion rate times the base, at least what was in
// flight) went past it. A pool of 8 connections of 200 ms, MaxInFlight
// 10, open loop at 2x.
func TestSuspectKeepsMaxInFlight(t *testing.T) {
	s := newSim(t, Config{MaxInFlight: 10}, 8, 200*time.Millisecond, 1)
	s.open(20, 0, 3*time.Second, 5*time.Second)
	s.open(80, 3*time.Second, 8*time.Second, 5*time.Second)
	maxIn, suspectSeen := 0, false
	for d := time.Millisecond; d <= 8*time.Second; d += time.Millisecond {
		s.run(d)
		maxIn = max(maxIn, s.l.InFlight())
		suspectSeen = suspectSeen || s.l.suspect.Load()
	}
	if !suspectSeen {
		t.Fatal("the server never became suspect: the test proves nothing")
	}
	if maxIn > 10 {
		t.Errorf("max in flight %d > MaxInFlight 10", maxIn)
	}
}

// The same through Wait, the suspect state set by hand with a cap of 6
// and MaxInFlight 2: two requests go in; a third waits (here until its
// context ends) instead of going past the fixed cap.
func TestSuspectWaitKeepsMaxInFlight(t *testing.T) {
	l, err := New(Config{MaxInFlight: 2, QueueSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	l.suspectCap.Store(6)
	l.suspect.Store(true)
	var ps []Permit
	for range 2 {
		p, err := l.Wait(context.Background(), ClassFirst, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if p, err := l.Wait(ctx, ClassFirst, time.Time{}); err == nil {
		ps = append(ps, p)
		t.Errorf("a third request went in with MaxInFlight 2: %d in flight", l.InFlight())
	}
	if n := l.InFlight(); n > 2 {
		t.Errorf("%d in flight with MaxInFlight 2", n)
	}
	for _, p := range ps {
		p.Release(Ignored)
	}
}

// A MaxInFlight so large that its class caps overflow (capAll x share /
// 1000 wrapped negative, and retries were capped at 1) is refused; the
// largest valid one caps nothing.
func TestHugeMaxInFlight(t *testing.T) {
	if _, err := New(Config{MaxInFlight: math.MaxInt}); err == nil {
		t.Fatal("MaxInFlight math.MaxInt: no error")
	}
	l, err := New(Config{MaxInFlight: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	p1, err1 := l.Acquire(ClassRetry, time.Time{})
	_, err2 := l.Acquire(ClassRetry, time.Time{})
	p1.Release(Ignored)
	if err1 != nil || err2 != nil {
		t.Errorf("second retry refused (%v, %v): capRetry = %d", err1, err2, l.capRetry)
	}
}

// A Clock that goes back does not freeze the windows until it has caught
// up (before, no window ended, and an overload could not end, for the
// length of the step).
func TestClockBackKeepsWindowsRolling(t *testing.T) {
	for _, back := range []time.Duration{0, time.Minute} {
		clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		l, err := New(Config{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		serve := func(n int) {
			for range n {
				p, _ := l.Acquire(ClassFirst, time.Time{})
				clk.Advance(time.Millisecond)
				p.Release(Measured)
			}
		}
		serve(1000) // a calm closed loop of one caller
		l.mu.Lock()
		l.overloaded.Store(true) // an overload in progress
		l.mu.Unlock()
		clk.Advance(-back)
		l.mu.Lock()
		before := l.histN
		l.mu.Unlock()
		serve(5000) // five seconds of calm traffic
		l.mu.Lock()
		rolled := l.histN - before
		l.mu.Unlock()
		if rolled < 10 {
			t.Errorf("clock back %v: %d windows rolled in 5 s", back, rolled)
		}
		if l.Overloaded() {
			t.Errorf("clock back %v: still overloaded after 5 s of calm traffic", back)
		}
	}
}
