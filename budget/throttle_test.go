package budget

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func newThrottle(t *testing.T, cfg ThrottleConfig) *Throttle {
	t.Helper()
	th, err := NewThrottle(cfg)
	if err != nil {
		t.Fatalf("NewThrottle(%+v): %v", cfg, err)
	}
	return th
}

func TestThrottleConfigValidation(t *testing.T) {
	tests := []struct {
		name  string
		cfg   ThrottleConfig
		field string // empty: valid
	}{
		{"zero", ThrottleConfig{}, ""},
		{"gRFC example", ThrottleConfig{MaxTokens: 10, TokenRatio: 0.1}, ""},
		{"max 1000", ThrottleConfig{MaxTokens: 1000}, ""},
		{"smallest", ThrottleConfig{MaxTokens: 0.001, TokenRatio: 0.001}, ""},
		{"ratio above 1", ThrottleConfig{TokenRatio: 2}, ""},
		{"max negative", ThrottleConfig{MaxTokens: -1}, "MaxTokens"},
		{"max above 1000", ThrottleConfig{MaxTokens: 1000.001}, "MaxTokens"},
		{"max below precision", ThrottleConfig{MaxTokens: 0.0004}, "MaxTokens"},
		{"max NaN", ThrottleConfig{MaxTokens: math.NaN()}, "MaxTokens"},
		{"max Inf", ThrottleConfig{MaxTokens: math.Inf(1)}, "MaxTokens"},
		{"ratio negative", ThrottleConfig{TokenRatio: -0.1}, "TokenRatio"},
		{"ratio below precision", ThrottleConfig{TokenRatio: 0.0004}, "TokenRatio"},
		{"ratio above 1000", ThrottleConfig{TokenRatio: 1001}, "TokenRatio"},
		{"ratio NaN", ThrottleConfig{TokenRatio: math.NaN()}, "TokenRatio"},
		{"ratio -Inf", ThrottleConfig{TokenRatio: math.Inf(-1)}, "TokenRatio"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th, err := NewThrottle(tt.cfg)
			if tt.field == "" {
				if err != nil || th == nil {
					t.Fatalf("NewThrottle(%+v) = %v, %v; want a throttle", tt.cfg, th, err)
				}
				return
			}
			if err == nil || th != nil {
				t.Fatalf("NewThrottle(%+v) = %v, %v; want an error naming %s", tt.cfg, th, err, tt.field)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("got error %v, want it to wrap ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("got error %q, want it to name %s", err, tt.field)
			}
		})
	}
}

func TestThrottleDefaults(t *testing.T) {
	th := newThrottle(t, ThrottleConfig{})
	if got := th.Config(); got.MaxTokens != 10 || got.TokenRatio != 0.1 {
		t.Errorf("defaults: got %+v, want MaxTokens 10, TokenRatio 0.1", got)
	}
	if s := th.Snapshot(); s.Tokens != 10 || s.MaxTokens != 10 {
		t.Errorf("initial snapshot: got %+v, want 10 of 10 tokens", s)
	}
}

// The arithmetic of gRFC A6 with its example config (maxTokens 10,
// tokenRatio 0.1): a failure takes 1 token, a success adds 0.1, and retries
// are allowed only while tokens > 5.
func TestThrottleTokenArithmetic(t *testing.T) {
	th := newThrottle(t, ThrottleConfig{MaxTokens: 10, TokenRatio: 0.1})
	steps := []struct {
		outcome string // "F" failure, "S" success, "" none
		tokens  float64
		retry   bool
	}{
		{"", 10, true},
		{"S", 10, true}, // capped at MaxTokens
		{"F", 9, true},
		{"F", 8, true},
		{"F", 7, true},
		{"F", 6, true},
		{"F", 5, false}, // 5 <= 10/2: the fifth failure in a row stops retries
		{"F", 4, false},
		{"S", 4.1, false},
		{"S", 4.2, false},
		{"F", 3.2, false},
		{"F", 2.2, false},
		{"F", 1.2, false},
		{"F", 0.2, false},
		{"F", 0, false}, // floored at 0
		{"F", 0, false},
	}
	for i, st := range steps {
		switch st.outcome {
		case "F":
			th.RecordOutcome(false)
		case "S":
			th.RecordOutcome(true)
		}
		th.RecordRequest() // ignored
		if got := th.Snapshot().Tokens; got != st.tokens {
			t.Fatalf("step %d (%q): got %v tokens, want %v", i, st.outcome, got, st.tokens)
		}
		if got := th.TryRetry(); got != st.retry {
			t.Fatalf("step %d: TryRetry = %v at %v tokens, want %v", i, got, st.tokens, st.retry)
		}
	}
	// From 0, 51 successes (5.1 tokens) bring retries back; 50 do not.
	for range 50 {
		th.RecordOutcome(true)
	}
	if th.TryRetry() {
		t.Fatalf("at %v tokens: TryRetry granted, want refused", th.Snapshot().Tokens)
	}
	th.RecordOutcome(true)
	if !th.TryRetry() {
		t.Fatalf("at %v tokens: TryRetry refused, want granted", th.Snapshot().Tokens)
	}
	s := th.Snapshot()
	if s.Tokens != 5.1 || s.Granted != 7 || s.Refused != 11 || s.Requests != 0 || s.Retries != 0 || s.Ratio != 0 {
		t.Errorf("final snapshot: got %+v, want 5.1 tokens, 7 granted, 11 refused, no window counts", s)
	}
}

// Tokens are kept in thousandths: ratios that are not exact in binary
// floating point add up exactly, so the threshold is hit exactly.
func TestThrottleExactThousandths(t *testing.T) {
	th := newThrottle(t, ThrottleConfig{MaxTokens: 6, TokenRatio: 0.3})
	for range 6 {
		th.RecordOutcome(false)
	}
	for range 10 {
		th.RecordOutcome(true)
	}
	if got := th.Snapshot().Tokens; got != 3 {
		t.Errorf("0 + 10 x 0.3: got %v tokens, want 3", got)
	}
	if th.TryRetry() {
		t.Error("at 3 of 6 tokens: TryRetry granted, want refused (3 <= 6/2)")
	}
	th.RecordOutcome(true)
	if got := th.Snapshot().Tokens; got != 3.3 || !th.TryRetry() {
		t.Errorf("at %v of 6 tokens: TryRetry refused, want 3.3 tokens and granted", got)
	}
}
