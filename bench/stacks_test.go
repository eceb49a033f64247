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
	// Two stacks decide by time or chance: stormguard's adaptive throttle
	// retries only a lone failure when the warm-up's accept is 50 ms old
	// or more, and marks payment down at once when its channel is broken
	// (so 1 to 3 calls, by the machine's speed), and
	// failsafe-go's adaptive throttler rejects at random (and its
	// rejection is not a gRPC status: the user gets Unknown). For them
	// only the wiring is checked: the request reached payment, at most 3
	// times for stormguard, at most 3^3 for failsafe-go.
	loose := map[string]int64{"stormguard-adaptive": 3, "failsafe-adaptive": 27}
	for _, s := range Stacks() {
		t.Run(s.Name, func(t *testing.T) {
			r, err := RunDownOne(s, DefaultParams)
			if err != nil {
				t.Fatal(err)
			}
			if most, ok := loose[s.Name]; ok {
				if r.Received[2] < 1 || r.Received[2] > most {
					t.Errorf("calls at payment: got %d, want 1 to %d", r.Received[2], most)
				}
				return
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
