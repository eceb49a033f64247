package reliability

import (
	"testing"

	"github.com/stormguard/stormguard/interceptor"
)

// FuzzParseTierPolicyConfig covers the one parser of the interceptor
// package that had no fuzz target: the operator's tier policy file (JSON or
// YAML). Whatever the input, parsing never panics, and a config it accepts
// yields a policy that never allows fewer than one attempt, and never
// more attempts for a deeper depth or for upstream retries: a caller can
// forge a deeper depth or upstream retries, never a shallower depth or
// none, so this is what makes forged metadata harmless (see also
// interceptor's FuzzForgedMetadata).
func FuzzParseTierPolicyConfig(f *testing.F) {
	f.Add([]byte(`{"attemptsByDepth":[3,2,1]}`))
	f.Add([]byte("attemptsByDepth: [3, 2, 1]\ndeeperAttempts: 1\nupstreamRetriedAttempts: 2\n"))
	f.Add([]byte("attemptsByDepth: [-1]\n"))
	f.Add([]byte("deeperAttempts: 99999999999999999999\n"))
	f.Add([]byte("{}"))
	f.Add([]byte("attemptsByDepth: [2]\n"))    // depth 1 once had the configured 3
	f.Add([]byte("attemptsByDepth: [1, 3]\n")) // not monotone
	f.Add([]byte("attemptsByDepth: [3, 3]\ndeeperAttempts: 5\n"))
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
		for _, configured := range []int{1, interceptor.DefaultMaxAttempts, interceptor.MaxAttempts} {
			for d := range interceptor.MaxDepth {
				shallow, deep := p(interceptor.Info{Depth: d}, configured), p(interceptor.Info{Depth: d + 1}, configured)
				if deep > shallow {
					t.Fatalf("policy from %q (configured %d): depth %d allows %d attempts, depth %d only %d", data, configured, d+1, deep, d, shallow)
				}
				if up := p(interceptor.Info{Depth: d, UpstreamRetries: 1}, configured); up > shallow {
					t.Fatalf("policy from %q (configured %d): upstream retries at depth %d allow %d attempts, none %d", data, configured, d, up, shallow)
				}
			}
		}
	})
}
