package breaker

import (
	"fmt"
	"sync"

	"github.com/stormguard/stormguard/internal/keyed"
	"github.com/stormguard/stormguard/internal/listeners"
)

// Set holds one Breaker per key, created on first use from one Config with
// the key as Name (so OnStateChange receives the key). Keys are typically
// the target, or the target and method. It is safe for concurrent use;
// Get for an existing key takes no lock.
//
// A Set holds at most maxKeys breakers. When it is full, Get for a new key
// evicts one breaker, chosen by a clock hand that sweeps the breakers in
// insertion order: it skips breakers that hold callers out or probe
// (half open, or open within their interval), and gives the others used
// since its last pass (or, for a new one, since the Get that created it)
// a second chance. So the victim is a closed breaker, or an open one whose
// interval ended and that no one has called since (its target went away),
// not used recently, if there is any; only when every breaker holds is
// one of them evicted (the one under the hand, roughly the oldest). An evicted
// breaker keeps working for whoever holds it, but the Set forgets it: the
// next Get for its key creates a fresh, closed breaker.
//
// The zero Set is usable: the defaults of a zero Config and
// DefaultMaxKeys.
type Set struct {
	cfg  Config // normalized; OnStateChange is the user's
	m    keyed.Map[*Breaker]
	zero sync.Once // a Set not made by NewSet takes the defaults

	// listeners are called after cfg.OnStateChange.
	listeners listeners.List[func(name string, from, to State)]
}

// NewSet returns an empty Set for at most maxKeys breakers made from cfg.
// Zero maxKeys means DefaultMaxKeys (1024). The error wraps
// ErrInvalidConfig when cfg or maxKeys is invalid.
func NewSet(cfg Config, maxKeys int) (*Set, error) {
	n, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	switch {
	case maxKeys < 0:
		return nil, fmt.Errorf("%w: maxKeys %d is negative", ErrInvalidConfig, maxKeys)
	case maxKeys == 0:
		maxKeys = DefaultMaxKeys
	}
	s := &Set{cfg: n}
	s.m.Max = maxKeys
	s.m.Pinned = (*Breaker).holding
	return s, nil
}

// Get returns the breaker for key, creating it if needed. Callers may keep
// the result; see Set for what eviction means for it.
func (s *Set) Get(key string) *Breaker {
	s.zero.Do(s.defaults)
	return s.m.Get(key, func() *Breaker {
		cfg := s.cfg
		cfg.Name = key
		cfg.OnStateChange = s.stateChanged
		return newBreaker(cfg)
	})
}

// defaults sets up a zero Set (NewSet sets Max).
func (s *Set) defaults() {
	if s.m.Max == 0 {
		s.cfg, _ = Config{}.normalize()
		s.m.Max = DefaultMaxKeys
		s.m.Pinned = (*Breaker).holding
	}
}

// Len returns the number of breakers in the set.
func (s *Set) Len() int { return s.m.Len() }

// Range calls f for each key and breaker in the set, in no particular
// order, until f returns false. No lock is held while f runs; f may call
// any method of the Set. Breakers added or evicted meanwhile may or may not
// be visited.
func (s *Set) Range(f func(key string, b *Breaker) bool) { s.m.Range(f) }

// Snapshot returns a snapshot of every breaker in the set, by key.
func (s *Set) Snapshot() map[string]Snapshot {
	out := make(map[string]Snapshot)
	s.Range(func(key string, b *Breaker) bool {
		out[key] = b.Snapshot()
		return true
	})
	return out
}

// Config returns the Config the Set makes its breakers from, with defaults
// filled in. Its OnStateChange is the one given to NewSet.
func (s *Set) Config() Config {
	s.zero.Do(s.defaults)
	return s.cfg
}

// AddStateListener adds f to the functions called after each state change
// of every breaker of the set, those that exist and those to come, after
// the Config's OnStateChange and with the same guarantees: never with a
// lock held, serialized per breaker, in the order of the changes. A nil f
// is ignored. There is no removal.
//
// key names the listener: adding one under a key already present replaces
// that listener instead of adding a second, so that code building several
// interceptors from one Set (the interceptor package keys its listener by
// the observer) reports each change once. A nil key, or one whose type is
// not comparable, never matches: the listener is always added. If
// OnStateChange or a listener panics, the listeners after it miss that
// change.
func (s *Set) AddStateListener(key any, f func(name string, from, to State)) {
	if f != nil {
		s.listeners.Add(key, f)
	}
}

// stateChanged is the OnStateChange of every breaker of the set: the
// user's callback, then the listeners.
func (s *Set) stateChanged(name string, from, to State) {
	if f := s.cfg.OnStateChange; f != nil {
		f(name, from, to)
	}
	s.listeners.Each(func(f func(string, State, State)) { f(name, from, to) })
}
