package stormotel_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stormguard/stormguard/interceptor"
)

// Each hedge event counts in stormguard.client.hedges under its own
// stormguard.hedge value.
func TestHedgeCounter(t *testing.T) {
	m, r := newMetrics(t)
	ctx := context.Background()
	for kind, n := range map[interceptor.EventKind]int{
		interceptor.EventHedgeSent: 3, interceptor.EventHedgeWon: 2,
		interceptor.EventHedgeCancelled: 1, interceptor.EventHedgeRefused: 4,
	} {
		for range n {
			m.Observe(ctx, interceptor.Event{Kind: kind, Method: "/pkg.Catalog/Get", Target: "catalog:443"})
		}
	}
	got := map[string]string{}
	for k, v := range collect(t, r) {
		if strings.HasPrefix(k, "stormguard.client.hedges{") {
			got[k[strings.Index(k, "stormguard.hedge="):]] = v
		}
	}
	want := map[string]string{"sent": "3", "won": "2", "cancelled": "1", "refused": "4"}
	if len(got) != len(want) {
		t.Fatalf("hedge series %v, want one per outcome %v", got, want)
	}
	for outcome, n := range want {
		found := false
		for k, v := range got {
			if strings.HasPrefix(k, "stormguard.hedge="+outcome+",") || k == "stormguard.hedge="+outcome+"}" {
				found = v == n
			}
		}
		if !found {
			t.Errorf("stormguard.hedge=%s: want %s in %v", outcome, n, got)
		}
	}
}
