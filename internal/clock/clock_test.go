package clock

import (
	"strings"
	"testing"
	"time"
)

func TestFake(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := NewFake(start)
	if got := f.Now(); !got.Equal(start) {
		t.Fatalf("Now() = %v, want %v", got, start)
	}
	f.Advance(1500 * time.Millisecond)
	if got, want := f.Now().Sub(start), 1500*time.Millisecond; got != want {
		t.Fatalf("after Advance: elapsed %v, want %v", got, want)
	}
	f.Advance(-2 * time.Second)
	if got, want := f.Now().Sub(start), -500*time.Millisecond; got != want {
		t.Fatalf("after going back: elapsed %v, want %v", got, want)
	}
	f.Set(start)
	if got := f.Now(); !got.Equal(start) {
		t.Fatalf("after Set: %v, want %v", got, start)
	}
}

// TestRealIsSystemMonotonic: Real reads the system clock, between two
// readings of time.Now taken around it, and keeps the monotonic reading
// that makes durations immune to wall-clock jumps (time.Now().UTC(), or a
// time rebuilt from Unix seconds, would lose it).
func TestRealIsSystemMonotonic(t *testing.T) {
	var c Clock = Real{}
	before := time.Now()
	got := c.Now()
	after := time.Now()
	if got.Before(before) || got.After(after) {
		t.Fatalf("Real.Now() = %v, want between %v and %v", got, before, after)
	}
	if !strings.Contains(got.String(), " m=") {
		t.Fatalf("Real.Now() = %v carries no monotonic reading", got)
	}
	if got.Sub(before) < 0 || after.Sub(got) < 0 {
		t.Fatalf("monotonic order broken: %v, %v, %v", before, got, after)
	}
}

// Since goes on after a step back, from where it was, and never goes
// back itself.
func TestSinceSurvivesAStepBack(t *testing.T) {
	f := NewFake(time.Unix(1000, 0))
	s := NewSince(f)
	f.Advance(2 * time.Second)
	if got := s.Elapsed(); got != 2*time.Second {
		t.Fatalf("Elapsed %v, want 2s", got)
	}
	f.Advance(-time.Hour)
	if got := s.Elapsed(); got != 2*time.Second {
		t.Fatalf("after a step back of 1h: %v, want still 2s", got)
	}
	f.Advance(time.Second)
	if got := s.Elapsed(); got != 3*time.Second {
		t.Fatalf("a second after the step back: %v, want 3s", got)
	}
	if r := NewSince(nil); r.Elapsed() < 0 || !r.sys {
		t.Error("NewSince(nil) is not the system clock")
	}
}
