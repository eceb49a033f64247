package adaptive

import (
	"slices"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

// TestSetDownListener: listeners hear the down and up changes of every
// throttle of a Set, after the Config's OnDown; one added again under the
// same key replaces the first; nil and non-comparable keys always add.
func TestSetDownListener(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var log []string
	set, err := NewSet(Config{Clock: clk, Rand: fixedRand(0.5), OnDown: func(name string, down bool) {
		log = append(log, "config "+name+" "+onOff(down))
	}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	add := func(key any, tag string) {
		set.AddDownListener(key, func(name string, down bool) { log = append(log, tag+" "+name+" "+onOff(down)) })
	}
	type obs struct{ name string }
	o := &obs{name: "o"}
	add(o, "first o")
	add(o, "second o") // replaces "first o"
	add(nil, "nil")
	add([]int{1}, "slice")            // not comparable: added, never matched
	set.AddDownListener("nil f", nil) // ignored
	th := set.Get("payment")
	attempt(th, false, Accept)
	clk.Advance(time.Second)
	th.Connectivity(false)
	attempt(th, false, Overload)
	th.Revive()
	want := []string{
		"config payment down", "second o payment down", "nil payment down", "slice payment down",
		"config payment up", "second o payment up", "nil payment up", "slice payment up",
	}
	if !slices.Equal(log, want) {
		t.Fatalf("got %q, want %q", log, want)
	}
}

func onOff(down bool) string {
	if down {
		return "down"
	}
	return "up"
}
