package interceptor

import (
	"strings"
	"testing"
)

// TestParseTierPolicyConfigErrors: every error names the key and says
// what is valid; keys are matched exactly, so a snake_case or Go-cased key
// is refused with the key it may have meant.
func TestParseTierPolicyConfigErrors(t *testing.T) {
	tests := []struct {
		in   string
		want []string // substrings of the error
	}{
		{"attempts_by_depth: [3, 2, 1]\n", []string{`unknown key "attempts_by_depth"`, `did you mean "attemptsByDepth"`, "attemptsByDepth, deeperAttempts, upstreamRetriedAttempts"}},
		{"AttemptsByDepth: [3, 2, 1]\n", []string{`unknown key "AttemptsByDepth"`, `did you mean "attemptsByDepth"`, "case-sensitive"}},
		{`{"DeeperAttempts": 1}`, []string{`unknown key "DeeperAttempts"`, `did you mean "deeperAttempts"`}},
		{"retries: 3\n", []string{`unknown key "retries"`, "valid keys: attemptsByDepth, deeperAttempts, upstreamRetriedAttempts"}},
		{"attemptsByDepth: [3, 0]\n", []string{"attemptsByDepth[1] = 0", "from 1 to 100"}},
		{"attemptsByDepth: [3, 101]\n", []string{"attemptsByDepth[1] = 101", "from 1 to 100"}},
		{"attemptsByDepth: [3, 1.5]\n", []string{"attemptsByDepth[1]: want a whole number"}},
		{"attemptsByDepth: three\n", []string{"attemptsByDepth: want a list of whole numbers"}},
		{"deeperAttempts: [1]\n", []string{"deeperAttempts: want a whole number"}},
		{"deeperAttempts: 1_000_000_000_000_000_000\n", []string{"deeperAttempts = ", "from 1 to 100"}},
		{"deeperAttempts: -1\n", []string{"deeperAttempts = -1", "or 0 for the default"}},
		{"upstreamRetriedAttempts: 200\n", []string{"upstreamRetriedAttempts = 200"}},
		{"deeperAttempts: 1\ndeeperAttempts: 2\n", []string{"already set"}},
		{"[3, 2, 1]\n", []string{"want a mapping with the keys attemptsByDepth"}},
		{"attemptsByDepth: [3\n", []string{"not valid YAML or JSON"}},
	}
	for _, tt := range tests {
		_, err := ParseTierPolicyConfig([]byte(tt.in))
		if err == nil {
			t.Errorf("%q: got no error", tt.in)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q does not contain %q", tt.in, err, w)
			}
		}
		if strings.Contains(err.Error(), "unmarshaling JSON") {
			t.Errorf("%q: error %q speaks of JSON decoding internals", tt.in, err)
		}
	}
}

// TestParseTierPolicyConfigAccepts: YAML and JSON, and empty input.
func TestParseTierPolicyConfigAccepts(t *testing.T) {
	for _, in := range []string{
		"attemptsByDepth: [3, 2, 1]\ndeeperAttempts: 1\nupstreamRetriedAttempts: 2\n",
		`{"attemptsByDepth": [3, 2, 1], "deeperAttempts": 1, "upstreamRetriedAttempts": 2}`,
		"# gateway 3, order 2, payment 1\nattemptsByDepth:\n  - 3\n  - 2\n  - 1\ndeeperAttempts: 1.0\nupstreamRetriedAttempts: 2\n",
	} {
		cfg, err := ParseTierPolicyConfig([]byte(in))
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if got := cfg.DeeperAttempts + cfg.UpstreamRetriedAttempts; len(cfg.AttemptsByDepth) != 3 || got != 3 {
			t.Errorf("%q: got %+v", in, cfg)
		}
	}
	for _, in := range []string{"", "  \n", "{}", "null"} {
		cfg, err := ParseTierPolicyConfig([]byte(in))
		if err != nil || cfg.AttemptsByDepth != nil || cfg.DeeperAttempts != 0 || cfg.UpstreamRetriedAttempts != 0 {
			t.Errorf("%q: got %+v, %v; want the zero config", in, cfg, err)
		}
	}
}
