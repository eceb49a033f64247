package stormslog

import (
	"testing"

	"github.com/stormguard/stormguard/interceptor"
)

// Every stop reason has a label of its own: a new reason that falls into
// "other" (as StopThrottled did) makes the logs say less than the metrics.
func TestReasonNames(t *testing.T) {
	seen := map[string]interceptor.StopReason{}
	for r := interceptor.StopNotRetryable; r <= interceptor.StopThrottled; r++ {
		name := reasonName(r)
		if name == "other" {
			t.Errorf("%v (%d) is logged as %q", r, int(r), name)
		}
		if prev, ok := seen[name]; ok {
			t.Errorf("%v and %v share the label %q", prev, r, name)
		}
		seen[name] = r
	}
}
