package interceptor

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/metadata"
)

// chainAttempts returns, for tiers 0 to n-1 of a chain whose edge (tier 0)
// receives the metadata md, the attempts each tier's client allows on the
// path of first attempts under policy p (configured: DefaultMaxAttempts).
// It runs the real code: parseInfo on each tier's incoming metadata, and
// call.init and call.attemptContext for what its client sends on.
func chainAttempts(t *testing.T, p TierPolicy, md metadata.MD, n int) []int {
	t.Helper()
	cfg := defaultConfig()
	cfg.policy = p
	out := make([]int, n)
	for tier := range n {
		sc := &stateCtx{Context: context.Background()}
		sc.st.info = parseInfo(mdGet(md))
		var c call
		c.init(sc, &cfg, "passthrough:///next", "/svc/M")
		out[tier] = c.max
		actx, cancel := c.attemptContext(false, &mdContext{})
		md, _ = metadata.FromOutgoingContext(actx)
		cancel()
	}
	return out
}

// depthPolicy builds a TierPolicyConfig policy from fuzz bytes: up to 4
// entries of 1 to 5 attempts, deeperAttempts and upstreamRetriedAttempts
// of 0 to 5.
func depthPolicy(list []byte, deeper, upstream uint8) (TierPolicy, string) {
	cfg := TierPolicyConfig{DeeperAttempts: int(deeper % 6), UpstreamRetriedAttempts: int(upstream % 6)}
	for _, b := range list[:min(len(list), 4)] {
		cfg.AttemptsByDepth = append(cfg.AttemptsByDepth, 1+int(b%5))
	}
	p, err := cfg.Policy()
	if err != nil {
		panic(err) // every value above is valid
	}
	return p, fmt.Sprintf("%+v", cfg)
}

// FuzzForgedMetadata checks the promise of the metadata protocol: whatever
// a caller the edge does not control sends (forged, malformed, repeated),
// no tier of the chain allows more attempts than for an honest request,
// which carries no metadata. It checks DefaultTierPolicy and depth
// policies of any shape, monotone or not.
func FuzzForgedMetadata(f *testing.F) {
	f.Add("9", "", "", "", []byte{2, 1, 0}, uint8(0), uint8(0)) // [3,2,1], depth 9
	f.Add("garbage", "", "", "", []byte{2, 0}, uint8(0), uint8(0))
	f.Add("1", "", "", "", []byte{0, 2}, uint8(0), uint8(0)) // [1,3]: not monotone
	f.Add("2", "0", "0", "", []byte{2, 2, 2}, uint8(5), uint8(0))
	f.Add("-1", "-1", "x", "0", []byte{4}, uint8(2), uint8(5))
	f.Add("99999999999999999999", "1", "", "", []byte{}, uint8(3), uint8(0))
	f.Fuzz(func(t *testing.T, depth, attempt, upstream, previous string, list []byte, deeper, upstreamRetried uint8) {
		forged := metadata.MD{}
		for k, v := range map[string]string{MetadataDepth: depth, MetadataAttempt: attempt, MetadataUpstreamRetries: upstream, MetadataPreviousAttempts: previous} {
			if v != "" {
				forged[k] = []string{v}
			}
		}
		dp, desc := depthPolicy(list, deeper, upstreamRetried)
		for _, pc := range []struct {
			name string
			p    TierPolicy
		}{{"DefaultTierPolicy", DefaultTierPolicy}, {desc, dp}} {
			honest := chainAttempts(t, pc.p, metadata.MD{}, 4)
			got := chainAttempts(t, pc.p, forged, 4)
			for tier := range honest {
				if got[tier] > honest[tier] {
					t.Fatalf("%s, depth %q attempt %q upstream %q previous %q: tier %d allows %d attempts, an honest request %d (all tiers: %v vs %v)",
						pc.name, depth, attempt, upstream, previous, tier, got[tier], honest[tier], got, honest)
				}
			}
		}
	})
}

// TestDepthPolicyNeverGrowsWithDepth: for any list, a deeper depth gets
// at most the attempts of a shallower one, past the list included.
func TestDepthPolicyNeverGrowsWithDepth(t *testing.T) {
	for _, tt := range []struct {
		cfg  TierPolicyConfig
		want string // attempts at depths 0 to 5, configured 4
	}{
		{TierPolicyConfig{AttemptsByDepth: []int{3, 2, 1}}, "[3 2 1 1 1 1]"},
		{TierPolicyConfig{AttemptsByDepth: []int{3, 1}}, "[3 1 1 1 1 1]"},
		{TierPolicyConfig{AttemptsByDepth: []int{1, 3}}, "[1 1 1 1 1 1]"},
		{TierPolicyConfig{AttemptsByDepth: []int{3, 3}, DeeperAttempts: 2}, "[3 3 2 2 2 2]"},
		{TierPolicyConfig{AttemptsByDepth: []int{2}, DeeperAttempts: 3}, "[2 2 2 2 2 2]"},
		{TierPolicyConfig{DeeperAttempts: 2}, "[2 2 2 2 2 2]"},
		{TierPolicyConfig{}, "[4 4 4 4 4 4]"},
	} {
		p, err := tt.cfg.Policy()
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		for d := range 6 {
			got = append(got, p(Info{Depth: d}, 4))
		}
		if fmt.Sprint(got) != tt.want {
			t.Errorf("%+v: got %v, want %s", tt.cfg, got, tt.want)
		}
	}
}
