// Package keyed is a bounded map from keys to values created on first
// use, for the per-target sets of breaker, adaptive and the interceptor's
// retry limiters: a key an attacker or a churn of pods chooses must not
// grow memory without bound, nor leave a new key unprotected. Standard
// library only.
package keyed

import (
	"sync"
	"sync/atomic"
)

// Map holds at most Max values. Get for a key present takes no lock.
// When the Map is full, Get for a new key evicts one value, chosen by a
// clock hand that sweeps the values in insertion order: it skips values
// that Pinned reports (a breaker that holds callers out, a target that is
// down: state worth keeping), and gives values used since its last pass (or,
// for a new one, since the Get that created it) a second chance. So the
// victim is a value not pinned and not used recently, if there is any
// value not pinned; when every value is pinned, the one under the hand.
// An evicted value keeps working for whoever holds it, but the Map
// forgets it: the next Get for its key creates a fresh one.
//
// Set Max (at least 1) and Pinned (nil: nothing is) before first use.
type Map[V any] struct {
	Max    int
	Pinned func(V) bool

	m    sync.Map   // string -> *entry[V]
	mu   sync.Mutex // serializes inserts and evictions
	ring []*entry[V]
	hand int
}

type entry[V any] struct {
	key  string
	v    V
	used atomic.Bool // set by Get, cleared by the clock hand
}

// Get returns the value for key, created by create when the key is new
// (called under the Map's insert lock, once per new key).
func (m *Map[V]) Get(key string, create func() V) V {
	if v, ok := m.Load(key); ok {
		return v
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.m.Load(key); ok {
		return v.(*entry[V]).v
	}
	// A new entry starts unused: it earns its second chance by a second
	// Get. (Started used, a flood of new keys would leave every entry
	// used, and the hand, after clearing them all, would evict whatever
	// it stood on, a hot key included.)
	e := &entry[V]{key: key, v: create()}
	if len(m.ring) < max(m.Max, 1) {
		m.ring = append(m.ring, e)
	} else {
		i := m.victim()
		m.m.Delete(m.ring[i].key)
		m.ring[i] = e
	}
	m.m.Store(key, e)
	return e.v
}

// Load returns the value for key, if the Map holds one, and counts it as
// used.
func (m *Map[V]) Load(key string) (V, bool) {
	v, ok := m.m.Load(key)
	if !ok {
		var zero V
		return zero, false
	}
	e := v.(*entry[V])
	if !e.used.Load() {
		e.used.Store(true)
	}
	return e.v, true
}

// victim returns the index in m.ring of the value to evict. m.mu is held.
func (m *Map[V]) victim() int {
	n := len(m.ring)
	firstFree := -1
	// Two rounds: the first may only clear used bits.
	for range 2 * n {
		i := m.hand
		m.hand = (m.hand + 1) % n
		e := m.ring[i]
		if m.Pinned != nil && m.Pinned(e.v) {
			continue
		}
		if firstFree < 0 {
			firstFree = i
		}
		if e.used.Load() {
			e.used.Store(false)
			continue
		}
		return i
	}
	if firstFree >= 0 {
		// Every value not pinned was used again while the hand went
		// round twice: evict one of them all the same, never a pinned
		// one.
		return firstFree
	}
	i := m.hand
	m.hand = (m.hand + 1) % n
	return i
}

// Len returns the number of values held.
func (m *Map[V]) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ring)
}

// Range calls f for each key and value, in no particular order, until f
// returns false. No lock is held while f runs. Values added or evicted
// meanwhile may or may not be visited.
func (m *Map[V]) Range(f func(key string, v V) bool) {
	m.m.Range(func(k, v any) bool { return f(k.(string), v.(*entry[V]).v) })
}
