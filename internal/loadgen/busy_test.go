package loadgen

import (
	"slices"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/testsvc"
)

func TestArrivalsBy(t *testing.T) {
	ms := time.Millisecond
	rates := []Rate{{From: 0, PerSecond: 100}, {From: 100 * ms, PerSecond: 1000}, {From: 200 * ms, PerSecond: 0}, {From: 300 * ms, PerSecond: 10}}
	for _, c := range []struct {
		at   time.Duration
		want int
	}{
		{0, 1},                 // the first arrival at once
		{9 * ms, 1},            // 10 ms apart
		{10 * ms, 2},           //
		{100*ms - 1, 10},       // the first phase: 0, 10, ..., 90 ms
		{100 * ms, 11},         // the second owns its start
		{101 * ms, 12},         // 1 ms apart
		{200*ms - 1, 10 + 100}, // all of the second
		{299 * ms, 110},        // none at rate 0
		{300 * ms, 111},        // the last at its start
		{500 * ms, 111 + 2},    // 100 ms apart
		{1000 * ms, 111 + 7},   // 300, ..., 900, 1000
	} {
		if got := arrivalsBy(rates, c.at); got != c.want {
			t.Errorf("arrivalsBy(%v) = %d, want %d", c.at, got, c.want)
		}
	}
}

// The marker takes each boundary's snapshot once and each step once, in
// order, whatever the ticks; Finish closes the slices the load did not
// reach.
func TestMarker(t *testing.T) {
	ms := time.Millisecond
	n := int64(0)
	var did []string
	m := NewMarker(300*ms, 100*ms, func() []int64 { return []int64{n, 2 * n} },
		[]Step{{At: 50 * ms, Do: func() { did = append(did, "a") }}, {At: 60 * ms, Do: func() { did = append(did, "b") }}})
	for _, x := range []struct {
		at  time.Duration
		add int64
	}{{0, 5}, {10 * ms, 1}, {70 * ms, 2}, {100 * ms, 3}, {150 * ms, 4}} {
		m.Phase(x.at)
		n += x.add
	}
	m.Finish()
	if !slices.Equal(did, []string{"a", "b"}) {
		t.Errorf("steps: %v, want a b", did)
	}
	if m.Slices() != 3 {
		t.Fatalf("%d slices, want 3", m.Slices())
	}
	// Slice 0: read at 0 (n = 0) and at 100 ms (n = 8); slice 1 until
	// Finish (n = 15); slice 2 reached by no tick: nothing.
	for i, want := range [][]int64{{8, 16}, {7, 14}, {0, 0}} {
		if got := m.Counts(i); !slices.Equal(got, want) {
			t.Errorf("slice %d: %v, want %v", i, got, want)
		}
	}
	s := Samples{{Start: 0}, {Start: 150 * ms}, {Start: 299 * ms}, {Start: 310 * ms}}
	if got := len(m.Samples(s, 1)); got != 1 {
		t.Errorf("slice 1: %d samples, want 1", got)
	}
	if got := len(m.Samples(s, 2)); got != 2 {
		t.Errorf("the last slice: %d samples, want 2 (one started after the end)", got)
	}
}

// Fixed concurrency on a healthy chain: every request succeeds, phase is
// called from 0, and the load stops after total.
func TestFixedConcurrency(t *testing.T) {
	c := testsvc.New(t, testsvc.Config{})
	if err := Warm(c); err != nil {
		t.Fatal(err)
	}
	var first time.Duration = -1
	calls := 0
	s := FixedConcurrency(c, 4, 100*time.Millisecond, 10*time.Second, 10*time.Millisecond, func(e time.Duration) {
		if first < 0 {
			first = e
		}
		calls++
	})
	if len(s) == 0 || s.Success() != 1 {
		t.Errorf("%d requests, success %v: want some, all successful", len(s), s.Success())
	}
	if first < 0 || first > 100*time.Millisecond || calls == 0 {
		t.Errorf("phase: first at %v, %d calls", first, calls)
	}
	if got := c.Tier("payment").Received(testsvc.Unary); got != int64(len(s)) {
		t.Errorf("payment received %d calls for %d requests", got, len(s))
	}
}

// An open loop of two rates sends no more than their arrivals, all
// served on a healthy chain.
func TestOpenLoopRates(t *testing.T) {
	c := testsvc.New(t, testsvc.Config{})
	if err := Warm(c); err != nil {
		t.Fatal(err)
	}
	rates := []Rate{{From: 0, PerSecond: 100}, {From: 100 * time.Millisecond, PerSecond: 400}}
	s := OpenLoopRates(c, rates, 200*time.Millisecond, 10*time.Second, nil)
	if most := arrivalsBy(rates, 200*time.Millisecond); len(s) == 0 || len(s) > most {
		t.Errorf("%d requests, want 1 to %d", len(s), most)
	}
	if s.Success() != 1 {
		t.Errorf("success %v, want 1", s.Success())
	}
}

// Warm connects every replica behind round_robin, and zeroes them all.
func TestWarmReplicas(t *testing.T) {
	c := testsvc.New(t, testsvc.Config{Replicas: 3})
	if err := Warm(c); err != nil {
		t.Fatal(err)
	}
	reps := c.Replicas("payment")
	for i, r := range reps {
		if got := r.Received(testsvc.Unary); got != 0 {
			t.Errorf("replica %d: %d calls after Warm, want 0", i, got)
		}
	}
	s := ClosedLoop(c, 1, 9, 10*time.Second, nil)
	for i, r := range reps {
		if got := r.Received(testsvc.Unary); got != 3 || s.Success() != 1 {
			t.Errorf("replica %d: %d of 9 sequential calls (success %v), want 3", i, got, s.Success())
		}
	}
}
