package stormotel

import (
	"maps"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
)

// MaxTargets is the number of distinct targets the instruments that are
// not kept per method (stormguard.breaker.transitions and
// AdaptiveMetrics' counters) report under their own names; later ones
// are reported as stormguard.target "_OTHER". A counter keeps a series
// for every target it ever saw, where the sets keep only the targets
// they hold now: a client that dials pod addresses through rolling
// deploys would grow the series without it.
const MaxTargets = 1024

// capped maps at most a given number of keys to values made on first
// use, first come, first served. The map is replaced, never changed, so
// that load reads it without a lock; mu serializes the replacements.
// The zero capped is empty and ready to use.
type capped[K comparable, V any] struct {
	p  atomic.Pointer[map[K]V]
	mu sync.Mutex
}

// load returns k's value, if it has one.
func (c *capped[K, V]) load(k K) (V, bool) {
	if p := c.p.Load(); p != nil {
		v, ok := (*p)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

// add returns k's value, made by newV if k has none and fewer than max
// keys have one, else other.
func (c *capped[K, V]) add(k K, max int, other V, newV func() V) V {
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
		return other
	}
	next := make(map[K]V, len(old)+1)
	maps.Copy(next, old)
	v := newV()
	next[k] = v
	c.p.Store(&next)
	return v
}

// targetAttrs hands out the stormguard.target attribute of a target, for
// at most MaxTargets distinct targets, then "_OTHER".
type targetAttrs struct {
	capped[string, attribute.KeyValue]
}

var otherTarget = TargetKey.String(otherValue)

func (t *targetAttrs) get(target string) attribute.KeyValue {
	if kv, ok := t.load(target); ok {
		return kv
	}
	return t.add(target, MaxTargets, otherTarget, func() attribute.KeyValue { return TargetKey.String(target) })
}
