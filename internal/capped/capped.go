// Package capped is a map of at most a given number of keys to values
// made on first use, first come, first kept, read without a lock: for
// the interceptor's per-method keys and stormotel's attributes, whose
// keys a program does not always bound. Standard library only.
package capped

import (
	"maps"
	"sync"
	"sync/atomic"
)

// Map maps at most a given number of keys to values made on first use.
// The map is replaced, never changed, so that Load reads it without a
// lock; mu serializes the replacements, and once the Map is full, Add
// takes no lock. The zero Map is empty and ready to use.
type Map[K comparable, V any] struct {
	p    atomic.Pointer[map[K]V]
	mu   sync.Mutex
	full atomic.Bool
}

// Load returns k's value, if it has one.
func (c *Map[K, V]) Load(k K) (V, bool) {
	if p := c.p.Load(); p != nil {
		v, ok := (*p)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

// Add returns k's value, made by newV if k has none and fewer than max
// keys have one, else other: a key that has one is read without a lock.
// Give every Add of a Map the same max. Each new key copies the map:
// keep max to the hundreds or low thousands.
func (c *Map[K, V]) Add(k K, max int, other V, newV func() V) V {
	if v, ok := c.Load(k); ok {
		return v
	}
	return c.missed(k, max, other, newV)
}

// missed is Add for a key its Load did not find. Another Add may have
// made k's value since, and filled the map with it: the map is final
// once full, so a second Load is the answer then.
func (c *Map[K, V]) missed(k K, max int, other V, newV func() V) V {
	if c.full.Load() {
		if v, ok := c.Load(k); ok {
			return v
		}
		return other
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var old map[K]V
	if p := c.p.Load(); p != nil {
		old = *p
	}
	if v, ok := old[k]; ok {
		return v
	}
	if len(old) >= max {
		c.full.Store(true)
		return other
	}
	next := make(map[K]V, len(old)+1)
	maps.Copy(next, old)
	v := newV()
	next[k] = v
	c.p.Store(&next)
	c.full.Store(len(next) >= max)
	return v
}

// Len returns the number of keys with a value.
func (c *Map[K, V]) Len() int {
	if p := c.p.Load(); p != nil {
		return len(*p)
	}
	return 0
}
