package stormotel

import (
	"go.opentelemetry.io/otel/attribute"

	"github.com/stormguard/stormguard/internal/capped"
)

// MaxTargets is the number of distinct targets the instruments that are
// not kept per method (stormguard.breaker.transitions and
// AdaptiveMetrics' counters) report under their own names; later ones
// are reported as stormguard.target "_OTHER". A counter keeps a series
// for every target it ever saw, where the sets keep only the targets
// they hold now: a client that dials pod addresses through rolling
// deploys would grow the series without it.
const MaxTargets = 1024

// targetAttrs hands out the stormguard.target attribute of a target, for
// at most MaxTargets distinct targets, then "_OTHER".
type targetAttrs struct {
	m capped.Map[string, attribute.KeyValue]
}

var otherTarget = TargetKey.String(otherValue)

func (t *targetAttrs) get(target string) attribute.KeyValue {
	return t.m.Add(target, MaxTargets, otherTarget, func() attribute.KeyValue { return TargetKey.String(target) })
}
