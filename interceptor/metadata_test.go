package interceptor

import (
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
)

func mdGet(md metadata.MD) func(string) []string { return func(k string) []string { return md[k] } }

func TestParseInfo(t *testing.T) {
	tests := []struct {
		name string
		md   metadata.MD
		want Info
	}{
		{"absent", metadata.MD{}, Info{}},
		{"first retry", metadata.Pairs(MetadataAttempt, "1"), Info{Attempt: 1, UpstreamRetries: 1}},
		{"deep, retrying above", metadata.Pairs(MetadataDepth, "2", MetadataUpstreamRetries, "1", MetadataAttempt, "2"), Info{Depth: 2, Attempt: 2, UpstreamRetries: 3}},
		{"grpc-go built-in retry", metadata.Pairs(MetadataPreviousAttempts, "2"), Info{Attempt: 2, UpstreamRetries: 2}},
		{"both attempt keys: the larger", metadata.Pairs(MetadataPreviousAttempts, "1", MetadataAttempt, "3"), Info{Attempt: 3, UpstreamRetries: 3}},
		// Malformed values count as the cautious ones: deepest, retrying.
		{"negative", metadata.Pairs(MetadataDepth, "-4", MetadataAttempt, "-1", MetadataUpstreamRetries, "-9"), Info{Depth: MaxDepth, Attempt: 1, UpstreamRetries: 2}},
		{"non-numeric", metadata.Pairs(MetadataDepth, "deep", MetadataAttempt, "0x1", MetadataUpstreamRetries, "1e3"), Info{Depth: MaxDepth, Attempt: 1, UpstreamRetries: 2}},
		{"huge digits clamp", metadata.Pairs(MetadataDepth, strings.Repeat("9", 4000), MetadataAttempt, "99999999999"), Info{Depth: MaxDepth, Attempt: MaxAttemptIndex, UpstreamRetries: MaxAttemptIndex}},
		{"large clamps", metadata.Pairs(MetadataDepth, "1000", MetadataUpstreamRetries, "5000"), Info{Depth: MaxDepth, UpstreamRetries: MaxUpstreamRetries}},
		{"repeated: the largest", metadata.MD{MetadataDepth: {"1", "3", "2"}}, Info{Depth: 3}},
		{"repeated with a malformed one", metadata.MD{MetadataDepth: {"1", "x", "3"}}, Info{Depth: MaxDepth}},
		{"spaces", metadata.Pairs(MetadataAttempt, " 2 "), Info{Attempt: 2, UpstreamRetries: 2}},
		{"empty", metadata.Pairs(MetadataAttempt, ""), Info{Attempt: 1, UpstreamRetries: 1}},
		{"a tier above hedges", metadata.Pairs(MetadataHedging, "1"), Info{Hedged: true}},
		{"a hedge", metadata.Pairs(MetadataHedging, "2", MetadataAttempt, "1"), Info{Attempt: 1, UpstreamRetries: 1, Hedged: true, Hedge: true}},
		{"hedging: unknown values clamp", metadata.Pairs(MetadataHedging, "7"), Info{Hedged: true, Hedge: true}},
		{"hedging: malformed is a hedge", metadata.Pairs(MetadataHedging, "yes"), Info{Hedged: true, Hedge: true}},
		{"hedging: 0 is none", metadata.Pairs(MetadataHedging, "0"), Info{}},
	}
	for _, tt := range tests {
		if got := parseInfo(mdGet(tt.md)); got != tt.want {
			t.Errorf("%s: got %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestPushbackParse(t *testing.T) {
	tests := []struct {
		vals   []string
		ms     int64
		exists bool
	}{
		{nil, 0, false},
		{[]string{"0"}, 0, true},
		{[]string{"250"}, 250, true},
		{[]string{"-1"}, -1, true},
		{[]string{"-99999"}, -1, true},
		{[]string{"soon"}, -1, true},
		{[]string{""}, -1, true},
		{[]string{"1", "2"}, -1, true},
		{[]string{"99999999999999999999999"}, -1, true},
		{[]string{"9223372036854775807"}, 9223372036854775807, true},
	}
	for _, tt := range tests {
		md := metadata.MD{}
		if tt.vals != nil {
			md[MetadataPushback] = tt.vals
		}
		ms, ok := pushback(md)
		if ms != tt.ms || ok != tt.exists {
			t.Errorf("pushback(%q) = %d, %v; want %d, %v", tt.vals, ms, ok, tt.ms, tt.exists)
		}
	}
}

// FuzzParseInfo: whatever arrives, parsing never panics, stays within the
// bounds, and never reports fewer upstream retries than the attempt index
// it saw (fewer would allow more retries below).
func FuzzParseInfo(f *testing.F) {
	f.Add("1", "2", "0", "", "")
	f.Add("-1", "99999999999999999999", "x", "3", "1,2")
	f.Add(strings.Repeat("9", 100), "", "-0", "+5", " 7")
	f.Fuzz(func(t *testing.T, attempt, depth, upstream, previous, extra string) {
		md := metadata.MD{
			MetadataAttempt:          {attempt, extra},
			MetadataDepth:            {depth},
			MetadataUpstreamRetries:  {upstream, extra},
			MetadataPreviousAttempts: {previous},
		}
		in := parseInfo(mdGet(md))
		if in.Depth < 0 || in.Depth > MaxDepth || in.Attempt < 0 || in.Attempt > MaxAttemptIndex ||
			in.UpstreamRetries < 0 || in.UpstreamRetries > MaxUpstreamRetries {
			t.Fatalf("out of bounds: %+v", in)
		}
		if in.UpstreamRetries < in.Attempt {
			t.Fatalf("upstream retries %d below the attempt index %d", in.UpstreamRetries, in.Attempt)
		}
		// Whether more attempts follow is FuzzForgedMetadata's question.
	})
}

// FuzzPushback: a hostile server's trailer never panics the client and
// never asks for a negative wait other than "do not retry" (-1).
func FuzzPushback(f *testing.F) {
	f.Add("100", "")
	f.Add("-5", "7")
	f.Add("18446744073709551616", "")
	f.Fuzz(func(t *testing.T, a, b string) {
		vals := []string{a}
		if b != "" {
			vals = append(vals, b)
		}
		ms, ok := pushback(metadata.MD{MetadataPushback: vals})
		if !ok {
			t.Fatal("a present trailer was reported absent")
		}
		if ms < -1 {
			t.Fatalf("pushback %d: want -1 or a non-negative delay", ms)
		}
		if len(vals) > 1 && ms != -1 {
			t.Fatalf("repeated pushback %q gave %d, want -1", vals, ms)
		}
	})
}

func TestParseTierPolicyConfig(t *testing.T) {
	good := []struct {
		in   string
		info Info
		want int
	}{
		{`{"attemptsByDepth":[3,2,1]}`, Info{Depth: 1}, 2},
		{"attemptsByDepth: [3, 2, 1]\ndeeperAttempts: 1\n", Info{Depth: 7}, 1},
		// Past the list: its smallest entry, never the configured number
		// (a forged deep depth must not buy retries).
		{"attemptsByDepth: [3]\n", Info{Depth: 5}, 3},
		{"attemptsByDepth: [3, 2, 1]\n", Info{Depth: MaxDepth}, 1},
		{"upstreamRetriedAttempts: 2\n", Info{UpstreamRetries: 3}, 2},
		{"{}", Info{UpstreamRetries: 1}, 1},
	}
	for _, tt := range good {
		cfg, err := ParseTierPolicyConfig([]byte(tt.in))
		if err != nil {
			t.Fatalf("%q: %v", tt.in, err)
		}
		p, err := cfg.Policy()
		if err != nil {
			t.Fatal(err)
		}
		if got := p(tt.info, 4); got != tt.want {
			t.Errorf("%q with %+v: got %d attempts, want %d", tt.in, tt.info, got, tt.want)
		}
	}
	for _, bad := range []string{
		`{"attemptsByDepth":[3,0]}`,
		`{"deeperAttempts":-1}`,
		`{"upstreamRetriedAttempts":-2}`,
		`{"attemptsByDpeth":[3]}`, // unknown field: a typo must not pass silently
		`{"deeperAttempts":102}`,
		"deeperAttempts: 1_000_000_000_000_000_000\n",
		strings.Repeat(" ", 64<<10+1),
		`attemptsByDepth: three`,
	} {
		if _, err := ParseTierPolicyConfig([]byte(bad)); err == nil {
			t.Errorf("%q: got no error", bad)
		}
	}
}

// TestPolicyCannotRaiseAttempts: a policy's answer is clamped to
// [1, configured].
func TestPolicyCannotRaiseAttempts(t *testing.T) {
	var s sleeps
	f := &fakeInvoker{results: []error{errUnavailable}}
	i := mustNew(t, s.option(), WithTierPolicy(func(Info, int) int { return 50 }))
	_ = i.UnaryClient()(ctxTimeout(t, 60e9), "/svc/M", nil, nil, newCC(t), f.invoke)
	if len(f.seen) != DefaultMaxAttempts {
		t.Fatalf("attempts: got %d, want %d", len(f.seen), DefaultMaxAttempts)
	}
	f = &fakeInvoker{results: []error{errUnavailable}}
	i = mustNew(t, s.option(), WithTierPolicy(func(Info, int) int { return -3 }))
	_ = i.UnaryClient()(ctxTimeout(t, 60e9), "/svc/M", nil, nil, newCC(t), f.invoke)
	if len(f.seen) != 1 {
		t.Fatalf("attempts: got %d, want 1", len(f.seen))
	}
}
