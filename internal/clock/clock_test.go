package clock

import (
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

func TestRealMoves(t *testing.T) {
	var c Clock = Real{}
	a := c.Now()
	b := c.Now()
	if b.Before(a) {
		t.Fatalf("real clock went back: %v then %v", a, b)
	}
}
