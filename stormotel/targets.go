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

// targetAttrs hands out the stormguard.target attribute of a target,
// for at most MaxTargets distinct targets, then "_OTHER". The map is
// replaced, never changed, so that a known target is read without a
// lock.
type targetAttrs struct {
	known atomic.Pointer[map[string]attribute.KeyValue]
	mu    sync.Mutex
}

var otherTarget = TargetKey.String(otherValue)

func (t *targetAttrs) get(target string) attribute.KeyValue {
	if m := t.known.Load(); m != nil {
		if kv, ok := (*m)[target]; ok {
			return kv
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var old map[string]attribute.KeyValue
	if m := t.known.Load(); m != nil {
		old = *m
	}
	if kv, ok := old[target]; ok {
		return kv
	}
	if len(old) >= MaxTargets {
		return otherTarget
	}
	next := make(map[string]attribute.KeyValue, len(old)+1)
	maps.Copy(next, old)
	kv := TargetKey.String(target)
	next[target] = kv
	t.known.Store(&next)
	return kv
}
