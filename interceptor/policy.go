package interceptor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// TierPolicy decides how many attempts a client may make for a request,
// from the Info of the request its handler is serving (the zero Info for a
// client outside any handler, such as the edge client), and the attempts
// configured with WithMaxAttempts. The result is clamped to
// [1, configured]: a policy can only lower the number of attempts.
//
// A caller can claim any depth and any number of upstream retries (unless
// the tier uses WithUntrustedCallers), but honest metadata has the
// smallest values: depth 0 at the edge, no upstream retries on a first
// attempt. So that forged or malformed metadata never buys more retries, a
// policy must not allow more attempts for a deeper depth, or for more
// upstream retries, than for a shallower depth or fewer upstream retries.
// DefaultTierPolicy and the policies of TierPolicyConfig hold this for any
// configuration; a policy of your own must hold it too.
type TierPolicy func(in Info, configured int) int

// DefaultTierPolicy makes one attempt only when a tier above is already
// retrying this request (UpstreamRetries > 0), and the configured number
// otherwise: only the tier next to a failure retries it. It does not read
// the depth (TierPolicyConfig.AttemptsByDepth does).
func DefaultTierPolicy(in Info, configured int) int {
	if in.UpstreamRetries > 0 {
		return 1
	}
	return configured
}

// WithTierPolicy replaces DefaultTierPolicy. See TierPolicy for the rule a
// policy must follow. Client side; usable per call.
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
// edge tier and for a client outside any handler).
//
// A deeper depth never gets more attempts than a shallower one: the
// attempts at depth d are the smallest of the list's entries 0 to d, and
// past the list the smallest entry of the whole list (or DeeperAttempts,
// when it is smaller). So [3, 2, 1] means 3, 2, 1, 1, 1, ... and [1, 3]
// means 1 at every depth. The reason: a caller the edge does not control
// can send any x-call-depth; were a deeper depth to get more attempts, a
// forged depth would buy retries (WithUntrustedCallers at the edge ignores
// the header, but the policy does not rely on it).
//
// The zero value of each field means: no per-depth limit (the configured
// attempts at every depth, or DeeperAttempts when it is set), and 1
// attempt when upstream retries are seen (the default policy).
type TierPolicyConfig struct {
	// AttemptsByDepth[d] is the most attempts at depth d; see above for
	// how the list is read.
	AttemptsByDepth []int `json:"attemptsByDepth,omitempty"`
	// DeeperAttempts, when not zero, bounds the attempts at depths past
	// AttemptsByDepth (at every depth, when the list is empty). Zero
	// means the smallest entry of AttemptsByDepth, or the configured
	// attempts for an empty list.
	DeeperAttempts int `json:"deeperAttempts,omitempty"`
	// UpstreamRetriedAttempts is the number of attempts when a tier above
	// is retrying. Zero means 1. Set it to the configured maximum (or
	// more) to ignore upstream retries.
	UpstreamRetriedAttempts int `json:"upstreamRetriedAttempts,omitempty"`
}

// maxPolicyBytes bounds the size of a tier policy file: a real one is a few
// lines.
const maxPolicyBytes = 64 << 10

// The keys of a tier policy file, as TierPolicyConfig's JSON tags spell
// them.
const (
	keyAttemptsByDepth         = "attemptsByDepth"
	keyDeeperAttempts          = "deeperAttempts"
	keyUpstreamRetriedAttempts = "upstreamRetriedAttempts"
)

var policyKeys = []string{keyAttemptsByDepth, keyDeeperAttempts, keyUpstreamRetriedAttempts}

// ParseTierPolicyConfig reads a TierPolicyConfig from JSON or YAML. Keys
// are exactly those of the example in TierPolicyConfig (attemptsByDepth,
// deeperAttempts, upstreamRetriedAttempts), spelt in that case; any other
// key, a repeated key, an invalid value and an input over 64 KiB are
// errors that name the key and say what is valid. Empty input is the zero
// TierPolicyConfig.
func ParseTierPolicyConfig(data []byte) (TierPolicyConfig, error) {
	if len(data) > maxPolicyBytes {
		return TierPolicyConfig{}, policyErr("%d bytes, want at most %d", len(data), maxPolicyBytes)
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return TierPolicyConfig{}, policyErr("not valid YAML or JSON: %v", err)
	}
	var fields map[string]json.RawMessage
	switch trimmed := bytes.TrimSpace(js); {
	case len(trimmed) == 0 || string(trimmed) == "null":
		return TierPolicyConfig{}, nil
	case trimmed[0] != '{':
		return TierPolicyConfig{}, policyErr("want a mapping with the keys %s", strings.Join(policyKeys, ", "))
	}
	if err := json.Unmarshal(js, &fields); err != nil {
		return TierPolicyConfig{}, policyErr("not valid YAML or JSON: %v", err)
	}
	var cfg TierPolicyConfig
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names) // report the same error for the same input
	for _, k := range names {
		v := fields[k]
		switch k {
		case keyAttemptsByDepth:
			cfg.AttemptsByDepth, err = parseIntList(k, v)
		case keyDeeperAttempts:
			cfg.DeeperAttempts, err = parseInt(k, v)
		case keyUpstreamRetriedAttempts:
			cfg.UpstreamRetriedAttempts, err = parseInt(k, v)
		default:
			err = unknownKey(k)
		}
		if err != nil {
			return TierPolicyConfig{}, err
		}
	}
	return cfg, cfg.validate()
}

func policyErr(format string, args ...any) error {
	return fmt.Errorf("stormguard: tier policy: "+format, args...)
}

// unknownKey names k, the key it may have meant, and the valid keys.
func unknownKey(k string) error {
	norm := func(s string) string {
		return strings.ToLower(strings.NewReplacer("_", "", "-", "", " ", "").Replace(s))
	}
	for _, valid := range policyKeys {
		if norm(k) == norm(valid) {
			return policyErr("unknown key %q; did you mean %q? (keys are case-sensitive; valid keys: %s)", k, valid, strings.Join(policyKeys, ", "))
		}
	}
	return policyErr("unknown key %q; valid keys: %s", k, strings.Join(policyKeys, ", "))
}

// parseInt reads a whole number for key. Numbers far out of any valid
// range are refused here, with the text as written.
func parseInt(key string, v json.RawMessage) (int, error) {
	var n json.Number
	d := json.NewDecoder(bytes.NewReader(v))
	d.UseNumber()
	if err := d.Decode(&n); err != nil {
		return 0, policyErr("%s: want a whole number, got %s", key, v)
	}
	f, err := n.Float64()
	if err != nil || f != math.Trunc(f) {
		return 0, policyErr("%s: want a whole number, got %s", key, v)
	}
	if math.Abs(f) > 1<<20 {
		return 0, policyErr("%s = %s, want a number of attempts from 1 to %d", key, v, MaxAttempts)
	}
	return int(f), nil
}

// parseIntList reads a list of whole numbers for key.
func parseIntList(key string, v json.RawMessage) ([]int, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil || raw == nil {
		return nil, policyErr("%s: want a list of whole numbers such as [3, 2, 1], got %s", key, v)
	}
	out := make([]int, len(raw))
	for i, r := range raw {
		n, err := parseInt(fmt.Sprintf("%s[%d]", key, i), r)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

func (p TierPolicyConfig) validate() error {
	if len(p.AttemptsByDepth) > MaxDepth+1 {
		return policyErr("%s has %d entries, want at most %d (depths 0 to %d)", keyAttemptsByDepth, len(p.AttemptsByDepth), MaxDepth+1, MaxDepth)
	}
	for d, n := range p.AttemptsByDepth {
		if n < 1 || n > MaxAttempts {
			return policyErr("%s[%d] = %d, want a number of attempts from 1 to %d", keyAttemptsByDepth, d, n, MaxAttempts)
		}
	}
	if p.DeeperAttempts < 0 || p.DeeperAttempts > MaxAttempts {
		return policyErr("%s = %d, want a number of attempts from 1 to %d, or 0 for the default", keyDeeperAttempts, p.DeeperAttempts, MaxAttempts)
	}
	if p.UpstreamRetriedAttempts < 0 || p.UpstreamRetriedAttempts > MaxAttempts {
		return policyErr("%s = %d, want a number of attempts from 1 to %d, or 0 for the default (1)", keyUpstreamRetriedAttempts, p.UpstreamRetriedAttempts, MaxAttempts)
	}
	return nil
}

// Policy returns the TierPolicy that p describes, or an error for invalid
// values.
func (p TierPolicyConfig) Policy() (TierPolicy, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	// byDepth[d] is the running minimum of the list, so that attempts
	// never grow with depth; deeper (0: no limit) applies past it.
	byDepth := slices.Clone(p.AttemptsByDepth)
	for d := 1; d < len(byDepth); d++ {
		byDepth[d] = min(byDepth[d], byDepth[d-1])
	}
	deeper := p.DeeperAttempts
	if n := len(byDepth); n > 0 {
		if deeper == 0 {
			deeper = byDepth[n-1]
		}
		deeper = min(deeper, byDepth[n-1])
	}
	upstream := max(p.UpstreamRetriedAttempts, 1)
	return func(in Info, configured int) int {
		n := configured
		switch {
		case in.Depth >= 0 && in.Depth < len(byDepth):
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
// invalid p makes New fail. Client side; usable per call.
func WithTierPolicyConfig(p TierPolicyConfig) Option {
	policy, err := p.Policy()
	return Option{apply: func(c *config) error {
		if err != nil {
			return invalid("WithTierPolicyConfig: %s", strings.TrimPrefix(err.Error(), "stormguard: "))
		}
		c.policy = policy
		return nil
	}}
}
