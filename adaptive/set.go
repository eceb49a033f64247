package adaptive

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/stormguard/stormguard/internal/listeners"
)

// DefaultMaxKeys is the number of throttles a Set holds when NewSet is
// given zero.
const DefaultMaxKeys = 1024

// Set holds one Throttle per key (typically the target), created on first
// use from one Config with the key as Name. It is safe for concurrent use;
// Get for an existing key takes no lock.
//
// A Set holds at most maxKeys throttles; once full, Get returns nil for a
// new key, and the caller goes unprotected for that key rather than
// growing without bound on keys an attacker may choose.
type Set struct {
	cfg Config // normalized
	max int64
	n   atomic.Int64
	m   sync.Map // string -> *Throttle
	mu  sync.Mutex

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
	return &Set{cfg: n, max: int64(maxKeys)}, nil
}

// Get returns the throttle for key, creating it if needed, or nil when
// the Set is full.
func (s *Set) Get(key string) *Throttle {
	if v, ok := s.m.Load(key); ok {
		return v.(*Throttle)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.m.Load(key); ok {
		return v.(*Throttle)
	}
	if s.n.Load() >= s.max {
		return nil
	}
	cfg := s.cfg
	cfg.Name = key
	cfg.OnDown = s.downChanged
	t := newThrottle(cfg)
	s.m.Store(key, t)
	s.n.Add(1)
	return t
}

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
func (s *Set) Range(f func(key string, t *Throttle) bool) {
	s.m.Range(func(k, v any) bool { return f(k.(string), v.(*Throttle)) })
}
