package interceptor

import (
	"fmt"

	"sigs.k8s.io/yaml"
)

// TierPolicy decides how many attempts a client may make for a request,
// from the Info of the request its handler is serving (the zero Info for a
// client outside any handler, such as the edge client), and the attempts
// configured with WithMaxAttempts. The result is clamped to
// [1, configured]: a policy can only lower the number of attempts.
type TierPolicy func(in Info, configured int) int

// DefaultTierPolicy makes one attempt only when a tier above is already
// retrying this request (UpstreamRetries > 0), and the configured number
// otherwise: retry less the deeper you go.
func DefaultTierPolicy(in Info, configured int) int {
	if in.UpstreamRetries > 0 {
		return 1
	}
	return configured
}

// WithTierPolicy replaces DefaultTierPolicy. Client side; usable per call.
func WithTierPolicy(p TierPolicy) Option {
	return Option{apply: func(c *config) error {
		if p == nil {
			return invalid("WithTierPolicy(nil)")
		}
		c.policy = p
		return nil
	}}
}

// TierPolicyConfig is the declarative form of a tier policy, for an
// operator to set "gateway 3, order 2, payment 1" in a file:
//
//	attemptsByDepth: [3, 2, 1]   # depth 0 (gateway), 1 (order), 2 (payment)
//	deeperAttempts: 1            # any depth past the list
//	upstreamRetriedAttempts: 1   # when a tier above is retrying
//
// Depth is the depth of the tier whose handler makes the call (0 for the
// edge tier and for a client outside any handler). The zero value of each
// field means: no per-depth limit, the configured attempts past the list,
// and 1 attempt when upstream retries are seen (the default policy).
type TierPolicyConfig struct {
	// AttemptsByDepth[d] is the number of attempts at depth d.
	AttemptsByDepth []int `json:"attemptsByDepth,omitempty"`
	// DeeperAttempts applies at depths past AttemptsByDepth. Zero means
	// the configured number of attempts.
	DeeperAttempts int `json:"deeperAttempts,omitempty"`
	// UpstreamRetriedAttempts is the number of attempts when a tier above
	// is retrying. Zero means 1. Set it to the configured maximum (or
	// more) to ignore upstream retries.
	UpstreamRetriedAttempts int `json:"upstreamRetriedAttempts,omitempty"`
}

// maxPolicyBytes bounds the size of a tier policy file: a real one is a few
// lines.
const maxPolicyBytes = 64 << 10

// ParseTierPolicyConfig reads a TierPolicyConfig from JSON or YAML, and
// rejects unknown fields, invalid values and inputs over 64 KiB.
func ParseTierPolicyConfig(data []byte) (TierPolicyConfig, error) {
	if len(data) > maxPolicyBytes {
		return TierPolicyConfig{}, fmt.Errorf("stormguard: tier policy: %d bytes, want at most %d", len(data), maxPolicyBytes)
	}
	var cfg TierPolicyConfig
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return TierPolicyConfig{}, fmt.Errorf("stormguard: tier policy: %w", err)
	}
	return cfg, cfg.validate()
}

func (p TierPolicyConfig) validate() error {
	const most = MaxAttemptIndex + 1 // the most WithMaxAttempts allows
	if len(p.AttemptsByDepth) > MaxDepth+1 {
		return fmt.Errorf("stormguard: tier policy: attemptsByDepth has %d entries, want at most %d (depths 0 to %d)", len(p.AttemptsByDepth), MaxDepth+1, MaxDepth)
	}
	for d, n := range p.AttemptsByDepth {
		if n < 1 || n > most {
			return fmt.Errorf("stormguard: tier policy: attemptsByDepth[%d] = %d, want 1 to %d", d, n, most)
		}
	}
	if p.DeeperAttempts < 0 || p.DeeperAttempts > most {
		return fmt.Errorf("stormguard: tier policy: deeperAttempts = %d, want 0 to %d", p.DeeperAttempts, most)
	}
	if p.UpstreamRetriedAttempts < 0 || p.UpstreamRetriedAttempts > most {
		return fmt.Errorf("stormguard: tier policy: upstreamRetriedAttempts = %d, want 0 to %d", p.UpstreamRetriedAttempts, most)
	}
	return nil
}

// Policy returns the TierPolicy that p describes, or an error for invalid
// values.
func (p TierPolicyConfig) Policy() (TierPolicy, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	byDepth := append([]int(nil), p.AttemptsByDepth...)
	deeper, upstream := p.DeeperAttempts, max(p.UpstreamRetriedAttempts, 1)
	return func(in Info, configured int) int {
		n := configured
		switch {
		case in.Depth < len(byDepth):
			n = byDepth[in.Depth]
		case deeper > 0:
			n = deeper
		}
		if in.UpstreamRetries > 0 {
			n = min(n, upstream)
		}
		return n
	}, nil
}

// WithTierPolicyConfig is WithTierPolicy for the declarative form; an
// invalid p makes New fail.
func WithTierPolicyConfig(p TierPolicyConfig) Option {
	policy, err := p.Policy()
	return Option{apply: func(c *config) error {
		if err != nil {
			return invalid("%v", err)
		}
		c.policy = policy
		return nil
	}}
}
