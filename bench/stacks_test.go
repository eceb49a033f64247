package bench

import (
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDownOne checks the wiring of every stack on the headline scenario:
// one user request with payment down. The counts are exact for every
// stack: no timing decides them.
func TestDownOne(t *testing.T) {
	want := map[string][3]int64{
		"none":                {1, 1, 1},
		"ggm-retry":           {3, 9, 27},
		"grpc-retry":          {3, 9, 27},
		"grpc-retry-throttle": {3, 6, 9},
		"failsafe-budget":     {3, 9, 27},
		"failsafe-breaker":    {3, 9, 27},
		"stormguard":          {1, 1, 3},
		"stormguard-throttle": {1, 1, 3},
	}
	for _, s := range Stacks() {
		t.Run(s.Name, func(t *testing.T) {
			r, err := RunDownOne(s, DefaultParams)
			if err != nil {
				t.Fatal(err)
			}
			if r.Code != codes.Unavailable {
				t.Errorf("user got %v, want Unavailable", r.Code)
			}
			if w, ok := want[s.Name]; !ok || r.Received != w {
				t.Errorf("calls received (gateway, order, payment): got %v, want %v", r.Received, w)
			}
		})
	}
}
