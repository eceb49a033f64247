package breaker

import (
	"slices"
	"testing"
)

// TestSetStateListener: a listener added to a Set hears every change of
// its breakers, those made before it was added too, after the Config's
// OnStateChange, and may call into the Set and the breaker (no lock held).
func TestSetStateListener(t *testing.T) {
	var log []string
	var s *Set
	s, _ = newTestSet(t, Config{MinimumCalls: 1, OnStateChange: func(name string, from, to State) {
		log = append(log, "user "+name+" "+from.String()+"->"+to.String())
	}}, 0)
	before := s.Get("before")
	s.AddStateListener("nil f", nil) // ignored
	s.AddStateListener("log", func(name string, from, to State) {
		// Calls that take the Set's and the breaker's locks: a listener
		// run under either would deadlock here.
		_ = s.Snapshot()
		_ = s.Get(name).Snapshot()
		log = append(log, "listener "+name+" "+from.String()+"->"+to.String())
	})
	after := s.Get("after")
	calls(t, before, 1, Failure)
	calls(t, after, 1, Failure)
	want := []string{
		"user before closed->open", "listener before closed->open",
		"user after closed->open", "listener after closed->open",
	}
	if !slices.Equal(log, want) {
		t.Fatalf("got changes %q, want %q", log, want)
	}
	if s.Config().OnStateChange == nil || s.Config().MinimumCalls != 1 {
		t.Fatalf("Config() = %+v, want the user's config with its OnStateChange", s.Config())
	}
}

// TestSetStateListenerWithoutCallback: a Set whose Config has no
// OnStateChange still reports to its listeners.
func TestSetStateListenerWithoutCallback(t *testing.T) {
	s, _ := newTestSet(t, Config{MinimumCalls: 1}, 0)
	var got []State
	s.AddStateListener(nil, func(_ string, _, to State) { got = append(got, to) })
	calls(t, s.Get("k"), 1, Failure)
	if want := []State{Open}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestSetStateListenerKeyed: a listener added again under the same key
// replaces the first (one report per change however many interceptors
// were built from the Set); nil and non-comparable keys always add.
func TestSetStateListenerKeyed(t *testing.T) {
	s, _ := newTestSet(t, Config{MinimumCalls: 1}, 0)
	var log []string
	add := func(key any, tag string) {
		s.AddStateListener(key, func(_ string, _, to State) { log = append(log, tag+" "+to.String()) })
	}
	type obs struct{ name string } // not of size zero: distinct pointers differ
	o := &obs{name: "o"}
	add(o, "first o")
	add(o, "second o")            // replaces "first o"
	add(&obs{name: "o"}, "other") // equal contents, another key
	add(nil, "nil 1")
	add(nil, "nil 2")
	add([]int{1}, "slice 1") // not comparable: added, never matched
	add([]int{1}, "slice 2")
	calls(t, s.Get("k"), 1, Failure)
	want := []string{"second o open", "other open", "nil 1 open", "nil 2 open", "slice 1 open", "slice 2 open"}
	if !slices.Equal(log, want) {
		t.Fatalf("got %q, want %q", log, want)
	}
}
