package reliability

import (
	"testing"

	"github.com/stormguard/stormguard/interceptor"
)

// FuzzParseTierPolicyConfig covers the one parser of the interceptor
// package that had no fuzz target: the operator's tier policy file (JSON or
// YAML). Whatever the input, parsing never panics, and a config it accepts
// yields a policy that never allows fewer than one attempt.
func FuzzParseTierPolicyConfig(f *testing.F) {
	f.Add([]byte(`{"attemptsByDepth":[3,2,1]}`))
	f.Add([]byte("attemptsByDepth: [3, 2, 1]\ndeeperAttempts: 1\nupstreamRetriedAttempts: 2\n"))
	f.Add([]byte("attemptsByDepth: [-1]\n"))
	f.Add([]byte("deeperAttempts: 99999999999999999999\n"))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := interceptor.ParseTierPolicyConfig(data)
		if err != nil {
			return
		}
		p, err := cfg.Policy()
		if err != nil {
			t.Fatalf("ParseTierPolicyConfig accepted %q but Policy failed: %v", data, err)
		}
		for _, in := range []interceptor.Info{{}, {Depth: 1}, {Depth: interceptor.MaxDepth}, {UpstreamRetries: 1}, {Depth: 2, UpstreamRetries: interceptor.MaxUpstreamRetries}} {
			if n := p(in, interceptor.DefaultMaxAttempts); n < 1 {
				t.Fatalf("policy from %q allows %d attempts for %+v, want >= 1", data, n, in)
			}
		}
	})
}
