package adaptive

import (
	"fmt"
	"sync"

	"github.com/stormguard/stormguard/internal/keyed"
	"github.com/stormguard/stormguard/internal/listeners"
)

// DefaultMaxKeys is the number of throttles a Set holds when NewSet is
// given zero.
const DefaultMaxKeys = 1024

// Set holds one Throttle per key (typically the target), created on first
// use from one Config with the key as Name. It is safe for concurrent use;
// Get for an existing key takes no lock.
//
// A Set holds at most maxKeys throttles. When it is full, Get for a new
// key evicts one throttle, chosen by a clock hand that sweeps them in
// insertion order: it skips throttles whose target is down, and gives
// those used since its last pass a second chance, so the victim is a
// throttle of a target that is up and was not used recently (with pod
// churn or per-method keys, the targets that are gone). An evicted
// throttle keeps working for whoever holds it; the next Get for its key
// starts a fresh one. (It used to return nil once full, and every new
// target then ran unthrottled, forever.)
//
// The zero Set is usable: the defaults of a zero Config and
// DefaultMaxKeys.
type Set struct {
	cfg  Config // normalized
	m    keyed.Map[*Throttle]
	zero sync.Once // a Set not made by NewSet takes the defaults

	// listeners are called after cfg.OnDown.
	listeners listeners.List[func(name string, down bool)]
}

// NewSet returns an empty Set for at most maxKeys throttles made from cfg.
// Zero maxKeys means DefaultMaxKeys. The error wraps ErrInvalidConfig.
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
	s.m.Pinned = (*Throttle).Down
	return s, nil
}

// Get returns the throttle for key, creating it if needed (see Set for
// what happens when the Set is full). It never returns nil.
func (s *Set) Get(key string) *Throttle {
	s.zero.Do(s.defaults)
	return s.m.Get(key, func() *Throttle {
		cfg := s.cfg
		cfg.Name = key
		cfg.OnDown = s.downChanged
		return newThrottle(cfg)
	})
}

// defaults sets up a zero Set (NewSet sets Max).
func (s *Set) defaults() {
	if s.m.Max == 0 {
		s.cfg, _ = Config{}.normalize()
		s.m.Max = DefaultMaxKeys
		s.m.Pinned = (*Throttle).Down
	}
}

// Len returns the number of throttles in the set.
func (s *Set) Len() int { return s.m.Len() }

// AddDownListener adds f to the functions called when a throttle of the
// set, one that exists or one to come, marks its target down (true) or up
// again (false): after the Config's OnDown, with no lock held. A nil f is
// ignored; there is no removal. Adding under a key already present
// replaces that listener, so that code that builds several interceptors
// from one Set (the interceptor package keys its listener by the
// observer) reports each change once; a nil key, or one whose type is not
// comparable, never matches, and the listener is always added.
func (s *Set) AddDownListener(key any, f func(name string, down bool)) {
	if f != nil {
		s.listeners.Add(key, f)
	}
}

// downChanged is the OnDown of every throttle of the set: the user's
// callback, then the listeners.
func (s *Set) downChanged(name string, down bool) {
	if f := s.cfg.OnDown; f != nil {
		f(name, down)
	}
	s.listeners.Each(func(f func(string, bool)) { f(name, down) })
}

// Range calls f for each key and throttle until f returns false, for
// metrics.
func (s *Set) Range(f func(key string, t *Throttle) bool) { s.m.Range(f) }
