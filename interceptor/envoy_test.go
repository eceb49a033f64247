package interceptor

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// envoyHeaders are the request headers an Envoy sidecar adds to attempt
// n of a gRPC call when include_request_attempt_count is set: the attempt
// count next to the headers it always adds.
func envoyHeaders(n int) []string {
	return []string{
		"x-envoy-attempt-count", strconv.Itoa(n),
		"x-request-id", "5b1d5d4e-3f0e-4b8e-9a55-0d6c3f2b7a10",
		"x-forwarded-proto", "http",
		"x-envoy-expected-rq-timeout-ms", "15000",
	}
}

func TestAddEnvoyRetries(t *testing.T) {
	tests := []struct {
		name string
		md   metadata.MD
		in   Info
		want Info
	}{
		{"absent", metadata.MD{}, Info{Depth: 1}, Info{Depth: 1}},
		{"first attempt", metadata.Pairs(envoyHeaders(1)...), Info{}, Info{}},
		{"first retry", metadata.Pairs(envoyHeaders(2)...), Info{}, Info{UpstreamRetries: 1}},
		{"third attempt, retries above", metadata.Pairs(envoyHeaders(3)...), Info{Depth: 2, Attempt: 1, UpstreamRetries: 1}, Info{Depth: 2, Attempt: 1, UpstreamRetries: 3}},
		{"zero", metadata.Pairs(MetadataEnvoyAttemptCount, "0"), Info{}, Info{}},
		{"malformed: a retry", metadata.Pairs(MetadataEnvoyAttemptCount, "two"), Info{}, Info{UpstreamRetries: 1}},
		{"negative: a retry", metadata.Pairs(MetadataEnvoyAttemptCount, "-5"), Info{}, Info{UpstreamRetries: 1}},
		{"repeated: the largest", metadata.MD{MetadataEnvoyAttemptCount: {"1", "4", "2"}}, Info{}, Info{UpstreamRetries: 3}},
		{"clamped", metadata.Pairs(MetadataEnvoyAttemptCount, "99999999999"), Info{UpstreamRetries: 999}, Info{UpstreamRetries: MaxUpstreamRetries}},
	}
	for _, tt := range tests {
		if got := addEnvoyRetries(tt.in, mdGet(tt.md)); got != tt.want {
			t.Errorf("%s: got %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// TestEnvoyAttemptCountOption: the server counts the count by default,
// not with WithEnvoyAttemptCount(false), never with WithUntrustedCallers.
func TestEnvoyAttemptCountOption(t *testing.T) {
	md := metadata.Pairs(append(envoyHeaders(3), MetadataDepth, "1")...)
	for _, tt := range []struct {
		opts []Option
		want Info
	}{
		{nil, Info{Depth: 1, UpstreamRetries: 2}},
		{[]Option{WithEnvoyAttemptCount(true)}, Info{Depth: 1, UpstreamRetries: 2}},
		{[]Option{WithEnvoyAttemptCount(false)}, Info{Depth: 1}},
		{[]Option{WithUntrustedCallers()}, Info{}},
		{[]Option{WithUntrustedCallers(), WithEnvoyAttemptCount(true)}, Info{}},
	} {
		ctx := metadata.NewIncomingContext(context.Background(), md)
		got, _ := FromContext(mustNew(t, tt.opts...).server.begin(ctx, "/svc/M"))
		if got != tt.want {
			t.Errorf("%d options: got %+v, want %+v", len(tt.opts), got, tt.want)
		}
	}
}

// envoySidecar is a unary client interceptor that behaves as an Envoy
// sidecar with a retry policy on gateway's calls to order: up to attempts
// attempts on UNAVAILABLE, each with the headers Envoy adds, and, like
// Envoy, blind to grpc-retry-pushback-ms.
func envoySidecar(attempts int) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var err error
		for n := 1; n <= attempts; n++ {
			err = invoker(metadata.AppendToOutgoingContext(ctx, envoyHeaders(n)...), method, req, reply, cc, opts...)
			if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
				return err
			}
		}
		return err
	}
}

// TestEnvoySidecarRetries: an Envoy sidecar that retries gateway's calls to
// order 3 times does not see stormguard's "do not retry". Order counts its
// retries through x-envoy-attempt-count and makes one attempt for each, so
// payment gets 3 + 1 + 1 calls; without it, 3 x 3.
func TestEnvoySidecarRetries(t *testing.T) {
	for _, tt := range []struct {
		server []Option
		want   []int64
	}{
		{nil, []int64{1, 3, 5}},
		{[]Option{WithEnvoyAttemptCount(false)}, []int64{1, 3, 9}},
	} {
		t.Run(fmt.Sprint(len(tt.server), " options"), func(t *testing.T) {
			c := startChain(t, chainSpec{
				client: func(int) []Option { return []Option{noWait} },
				dial: func(hop int) []grpc.DialOption {
					if hop != 1 {
						return nil
					}
					return append(mustNew(t, noWait).DialOptions(), grpc.WithChainUnaryInterceptor(envoySidecar(3)))
				},
				server: tt.server,
			})
			c.Tier("payment").SetDown(codes.Unavailable)
			_, err := c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("user got %v, want Unavailable", err)
			}
			if got := received(c); !slices.Equal(got, tt.want) {
				t.Fatalf("calls received (gateway, order, payment): got %v, want %v", got, tt.want)
			}
		})
	}
}

// FuzzAddEnvoyRetries: whatever Envoy's header says, the upstream retries
// never go down (which would allow more attempts) and stay in bounds.
func FuzzAddEnvoyRetries(f *testing.F) {
	f.Add("2", "", 0)
	f.Add("-1", "99999999999999999999", 5)
	f.Add("+3", " 7", 1000)
	f.Fuzz(func(t *testing.T, a, b string, upstream int) {
		in := Info{UpstreamRetries: min(max(upstream, 0), MaxUpstreamRetries)}
		vals := []string{a}
		if b != "" {
			vals = append(vals, b)
		}
		got := addEnvoyRetries(in, mdGet(metadata.MD{MetadataEnvoyAttemptCount: vals}))
		if got.UpstreamRetries < in.UpstreamRetries || got.UpstreamRetries > MaxUpstreamRetries {
			t.Fatalf("upstream retries %d -> %d for %q", in.UpstreamRetries, got.UpstreamRetries, vals)
		}
		if got.Depth != in.Depth || got.Attempt != in.Attempt {
			t.Fatalf("depth or attempt changed: %+v -> %+v", in, got)
		}
	})
}
