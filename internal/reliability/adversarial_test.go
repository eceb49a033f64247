package reliability

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// heapInUse returns the live heap after full collections: two, since a
// sync.Pool (grpc-go's buffer pools) keeps its items through one.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// maxHeapGrowth bounds what the adversarial tests may leave on the heap.
// Measured: about 0.2 MB (or less than before) for TestForgedMetadata.
// Keeping each forged request's metadata alive would leave about 0.1 MB
// per request of the "5000 repeated" cases, 2 MB per case of 20 requests.
const maxHeapGrowth = 2 << 20

func repeat(key, val string, n int) []string {
	kv := make([]string, 0, 2*n)
	for range n {
		kv = append(kv, key, val)
	}
	return kv
}

// forgeries are metadata a hostile or broken client may send.
func forgeries() map[string][]string {
	big := strings.Repeat("9", 8<<10)
	junk := strings.Repeat("x", 8<<10)
	m := map[string][]string{
		"huge depth":                {interceptor.MetadataDepth, "999999999999999999999999"},
		"negative depth":            {interceptor.MetadataDepth, "-5"},
		"negative attempt":          {interceptor.MetadataAttempt, "-1", interceptor.MetadataUpstreamRetries, "-7"},
		"huge attempt":              {interceptor.MetadataAttempt, "99999999999"},
		"non-numeric":               {interceptor.MetadataPreviousAttempts, "abc", interceptor.MetadataUpstreamRetries, "0x10", interceptor.MetadataDepth, "1e9"},
		"8 KB digits":               {interceptor.MetadataAttempt, big, interceptor.MetadataDepth, big, interceptor.MetadataUpstreamRetries, big, interceptor.MetadataPreviousAttempts, big},
		"8 KB junk":                 {interceptor.MetadataAttempt, junk, interceptor.MetadataDepth, junk, interceptor.MetadataUpstreamRetries, junk},
		"spaces and signs":          {interceptor.MetadataAttempt, " 3 ", interceptor.MetadataDepth, "+3", interceptor.MetadataUpstreamRetries, "-0"},
		"forged upstream retries":   {interceptor.MetadataUpstreamRetries, "5"},
		"forged pushback on a call": {interceptor.MetadataPushback, "-1"},
	}
	m["5000 repeated attempt keys"] = repeat(interceptor.MetadataAttempt, "1", 5000)
	m["5000 repeated mixed keys"] = append(repeat(interceptor.MetadataDepth, "-3", 2500), repeat(interceptor.MetadataUpstreamRetries, "zz", 2500)...)
	return m
}

// TestForgedMetadata: a plain client sends forged and malformed attempt
// metadata to the gateway of a full stormguard chain while payment is
// down, under the default tier policy and under the depth policy
// [3, 2, 1] (where a forged depth matters: depths past the list once had
// the configured attempts, so "huge depth" gave 3 calls at payment instead
// of 2). No tier panics, every tier's parsed Info stays within the
// bounds, no tier receives more calls per request than for an honest
// request (1/1/3 by default, 1/1/2 with the depth policy), and the heap
// does not grow. Budget and breaker never refuse here, so the counts are
// the policy's alone.
func TestForgedMetadata(t *testing.T) {
	const perCase = 20
	for _, pc := range []struct {
		name   string
		opts   []interceptor.Option
		honest [3]int64 // calls per request at gateway, order, payment
	}{
		{"default policy", nil, [3]int64{1, 1, 3}},
		{"depth policy [3,2,1]", []interceptor.Option{interceptor.WithTierPolicyConfig(interceptor.TierPolicyConfig{AttemptsByDepth: []int{3, 2, 1}})}, [3]int64{1, 1, 2}},
	} {
		t.Run(pc.name, func(t *testing.T) {
			var outOfBounds atomic.Int64
			check := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				in, ok := interceptor.FromContext(ctx)
				if !ok || in.Depth < 0 || in.Depth > interceptor.MaxDepth || in.Attempt < 0 || in.Attempt > interceptor.MaxAttemptIndex ||
					in.UpstreamRetries < 0 || in.UpstreamRetries > interceptor.MaxUpstreamRetries {
					outOfBounds.Add(1)
				}
				return h(ctx, req)
			}
			fc := frozen()
			c := fullChain(t, 1, stack{
				budget:  budget.Config{Clock: fc, MinRetriesPerSecond: 1000},
				breaker: breaker.Config{Clock: fc, MinimumCalls: 1 << 20},
				opts:    append([]interceptor.Option{fastBackoff}, pc.opts...),
				rawEdge: true,
				server:  func(int) []grpc.UnaryServerInterceptor { return []grpc.UnaryServerInterceptor{check} },
			})
			ctx := ctxT(t, 2*time.Minute)
			waitReady(t, ctx, c)
			tiers := [3]*testsvc.Tier{c.Tier("gateway"), c.Tier("order"), c.Tier("payment")}
			tiers[2].SetDown(codes.Unavailable)
			before := heapInUse()
			cases := forgeries()
			cases["honest"] = nil
			for name, kv := range cases {
				t.Run(name, func(t *testing.T) {
					var n0 [3]int64
					for i, tier := range tiers {
						n0[i] = tier.Received(testsvc.Unary)
					}
					for i := range perCase {
						rctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, kv...), 10*time.Second)
						_, err := c.Client().Unary(rctx, &testsvcv1.UnaryRequest{Id: fmt.Sprint(i)})
						cancel()
						if status.Code(err) != codes.Unavailable {
							t.Fatalf("request %d: got %v, want Unavailable", i, err)
						}
					}
					for i, tier := range tiers {
						got := tier.Received(testsvc.Unary) - n0[i]
						if got > pc.honest[i]*perCase || (kv == nil && got != pc.honest[i]*perCase) {
							t.Errorf("%s received %d calls for %d requests, want %d each as for an honest request",
								tier.Name(), got, perCase, pc.honest[i])
						}
					}
				})
			}
			if n := outOfBounds.Load(); n != 0 {
				t.Errorf("%d handlers saw an Info outside the bounds", n)
			}
			if grew := int64(heapInUse()) - int64(before); grew > maxHeapGrowth {
				t.Errorf("heap grew by %d bytes, want <= %d", grew, maxHeapGrowth)
			}
		})
	}
}

// hostile is a server that fails every call with UNAVAILABLE and a chosen
// pushback trailer, counting the attempts it sees.
type hostile struct {
	testsvcv1.UnimplementedTestServiceServer
	trailer  atomic.Pointer[metadata.MD]
	attempts atomic.Int64
}

func (h *hostile) fail(ctx context.Context) error {
	h.attempts.Add(1)
	if md := h.trailer.Load(); md != nil {
		_ = grpc.SetTrailer(ctx, *md)
	}
	return status.Error(codes.Unavailable, "hostile")
}

func (h *hostile) Unary(ctx context.Context, _ *testsvcv1.UnaryRequest) (*testsvcv1.UnaryResponse, error) {
	return nil, h.fail(ctx)
}

func (h *hostile) Bidi(stream grpc.BidiStreamingServer[testsvcv1.BidiRequest, testsvcv1.BidiResponse]) error {
	if _, err := stream.Recv(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return h.fail(stream.Context())
}

func startHostile(t *testing.T) (*hostile, *grpc.ClientConn) {
	t.Helper()
	h := &hostile{}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	testsvcv1.RegisterTestServiceServer(srv, h)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	set, err := breaker.NewSet(breaker.Config{Clock: frozen(), MinimumCalls: 1 << 20}, 0)
	if err != nil {
		t.Fatal(err)
	}
	i, err := interceptor.New(fastBackoff, interceptor.WithBudget(budget.Config{Clock: frozen()}), interceptor.WithBreaker(set))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///hostile",
		append(i.DialOptions(),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return h, conn
}

// TestHostilePushback: a server answers every call with UNAVAILABLE and a
// forged grpc-retry-pushback-ms trailer. The client never panics, never
// makes more attempts than configured, makes exactly one for "do not
// retry" (negative, malformed, repeated, overlong) and all of them for a
// valid delay, on unary calls and bidi streams alike; the calls leave
// nothing on the heap. (The heap is measured per case around the calls:
// each case's connection keeps its 2 MiB of bufconn buffers reachable
// after the case, which is not what this checks.)
func TestHostilePushback(t *testing.T) {
	const calls = 10
	ctx := ctxT(t, 2*time.Minute)
	cases := []struct {
		name string
		vals []string // nil: no trailer
		want int64    // attempts per call
	}{
		{"none", nil, 3},
		{"zero", []string{"0"}, 3},
		{"small", []string{"2"}, 3},
		{"spaces", []string{" 1 "}, 3},
		{"plus sign", []string{"+1"}, 3},
		{"huge, 20 digits", []string{"99999999999999999999"}, 1},
		{"minus one", []string{"-1"}, 1},
		{"very negative", []string{"-9223372036854775808"}, 1},
		{"non-numeric", []string{"soon"}, 1},
		{"float", []string{"1.5"}, 1},
		{"empty", []string{""}, 1},
		{"8 KB", []string{strings.Repeat("7", 8<<10)}, 1},
		{"repeated", []string{"1", "2"}, 1},
		{"1000 repeated", strings.Fields(strings.Repeat("5 ", 1000)), 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A fresh client per case: its budget's floor (100 retries on
			// the frozen clock) covers the 2 x 10 x 2 retries of a case.
			h, conn := startHostile(t)
			cl := testsvcv1.NewTestServiceClient(conn)
			var md metadata.MD
			if tc.vals != nil {
				md = metadata.MD{interceptor.MetadataPushback: tc.vals}
			}
			h.trailer.Store(&md)
			// One call of each kind first, so that the connection's own
			// buffers exist before the heap is measured; only what the
			// calls leave behind counts.
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, _ = cl.Unary(rctx, &testsvcv1.UnaryRequest{})
			cancel()
			_ = bidiOnce(ctx, cl)
			before := heapInUse()
			h.attempts.Store(0)
			for range calls {
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := cl.Unary(rctx, &testsvcv1.UnaryRequest{})
				cancel()
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("unary: got %v, want Unavailable", err)
				}
			}
			if got := h.attempts.Load(); got != tc.want*calls {
				t.Errorf("unary: %d attempts for %d calls, want %d each", got, calls, tc.want)
			}
			h.attempts.Store(0)
			for range calls {
				if err := bidiOnce(ctx, cl); status.Code(err) != codes.Unavailable {
					t.Fatalf("bidi: got %v, want Unavailable", err)
				}
			}
			if got := h.attempts.Load(); got != tc.want*calls {
				t.Errorf("bidi: %d attempts for %d streams, want %d each", got, calls, tc.want)
			}
			if grew := int64(heapInUse()) - int64(before); grew > maxHeapGrowth {
				t.Errorf("heap grew by %d bytes over %d calls, want <= %d", grew, 2*calls, maxHeapGrowth)
			}
		})
	}
}

func bidiOnce(ctx context.Context, cl testsvcv1.TestServiceClient) error {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := cl.Bidi(rctx)
	if err != nil {
		return err
	}
	if err := s.Send(&testsvcv1.BidiRequest{Id: "x"}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = s.Recv()
	return err
}
