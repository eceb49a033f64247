package breaker

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/stormguard/stormguard/internal/listeners"
)

// Set holds one Breaker per key, created on first use from one Config with
// the key as Name (so OnStateChange receives the key). Keys are typically
// the target, or the target and method. It is safe for concurrent use;
// Get for an existing key takes no lock.
//
// A Set holds at most maxKeys breakers. When it is full, Get for a new key
// evicts one breaker, chosen by a clock hand that sweeps the breakers in
// insertion order: it skips breakers that are not closed, and gives closed
// breakers used since its last pass (or, for a new one, since the Get that
// created it) a second chance. So the victim is a closed breaker that has
// not been used recently, if there is any closed breaker at all; only when every breaker is open or half-open is one of
// them evicted (the one under the hand, roughly the oldest). An evicted
// breaker keeps working for whoever holds it, but the Set forgets it: the
// next Get for its key creates a fresh, closed breaker.
type Set struct {
	cfg Config // normalized; OnStateChange is the user's
	max int
	m   sync.Map // string -> *entry

	// listeners are called after cfg.OnStateChange.
	listeners listeners.List[func(name string, from, to State)]

	mu   sync.Mutex // serializes inserts and evictions
	ring []*entry   // guarded by mu; the clock hand sweeps it
	hand int        // guarded by mu
}

type entry struct {
	key  string
	b    *Breaker
	used atomic.Bool // set by Get, cleared by the clock hand
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
	return &Set{cfg: n, max: maxKeys}, nil
}

// Get returns the breaker for key, creating it if needed. Callers may keep
// the result; see Set for what eviction means for it.
func (s *Set) Get(key string) *Breaker {
	if v, ok := s.m.Load(key); ok {
		e := v.(*entry)
		if !e.used.Load() {
			e.used.Store(true)
		}
		return e.b
	}
	return s.insert(key)
}

func (s *Set) insert(key string) *Breaker {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.m.Load(key); ok {
		return v.(*entry).b
	}
	cfg := s.cfg
	cfg.Name = key
	cfg.OnStateChange = s.stateChanged
	// A new entry starts unused: it earns its second chance by a second
	// Get. (Started used, a flood of new keys would leave every entry
	// used, and the hand, after clearing them all, would evict whatever
	// it stood on, a hot key included.)
	e := &entry{key: key, b: newBreaker(cfg)}
	if len(s.ring) < s.max {
		s.ring = append(s.ring, e)
	} else {
		i := s.victim()
		s.m.Delete(s.ring[i].key)
		s.ring[i] = e
	}
	s.m.Store(key, e)
	return e.b
}

// victim returns the index in s.ring of the breaker to evict. s.mu is held.
func (s *Set) victim() int {
	n := len(s.ring)
	firstClosed := -1
	// Two rounds: the first may only clear used bits.
	for range 2 * n {
		i := s.hand
		s.hand = (s.hand + 1) % n
		e := s.ring[i]
		if e.b.State() != Closed {
			continue
		}
		if firstClosed < 0 {
			firstClosed = i
		}
		if e.used.Load() {
			e.used.Store(false)
			continue
		}
		return i
	}
	if firstClosed >= 0 {
		// Every closed breaker was used again while the hand went round
		// twice: evict one of them all the same, never an open one.
		return firstClosed
	}
	// Every breaker is open or half-open.
	i := s.hand
	s.hand = (s.hand + 1) % n
	return i
}

// Len returns the number of breakers in the set.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ring)
}

// Range calls f for each key and breaker in the set, in no particular
// order, until f returns false. No lock is held while f runs; f may call
// any method of the Set. Breakers added or evicted meanwhile may or may not
// be visited.
func (s *Set) Range(f func(key string, b *Breaker) bool) {
	s.m.Range(func(k, v any) bool {
		return f(k.(string), v.(*entry).b)
	})
}

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
func (s *Set) Config() Config { return s.cfg }

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
