package interceptor

import (
	"context"
	"testing"

	"google.golang.org/grpc/metadata"
)

// The grpc-go this module builds with keeps incoming metadata where
// learnIncomingKey finds it: the server reads the attempt metadata
// without copying. Were it not found, every lookup would still be right
// (ValueFromIncomingContext), only slower; this test says so first.
func TestIncomingMetadataRaw(t *testing.T) {
	if incomingKey == nil {
		t.Fatal("grpc-go's incoming metadata key was not learnt: every request's metadata is read through ValueFromIncomingContext")
	}
	md := metadata.Pairs(MetadataDepth, "3", MetadataAttempt, "1")
	in := incomingOf(metadata.NewIncomingContext(context.Background(), md))
	if !in.raw || len(in.md) != 2 || &in.md[MetadataDepth][0] != &md[MetadataDepth][0] {
		t.Fatalf("incomingOf read %v (raw %v), want grpc-go's own map %v", in.md, in.raw, md)
	}
	if got := in.get(MetadataDepth); len(got) != 1 || got[0] != "3" {
		t.Fatalf("get(%s) = %v, want [3]", MetadataDepth, got)
	}
	if got := incomingOf(context.Background()).get(MetadataDepth); got != nil {
		t.Fatalf("no metadata: get = %v, want nil", got)
	}
	// Both ways read the same.
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(MetadataUpstreamRetries, "2", MetadataDepth, "x"))
	raw, _ := incomingInfo(incomingOf(ctx))
	copied, _ := incomingInfo(incoming{ctx: ctx})
	if raw != copied {
		t.Fatalf("raw read %+v, ValueFromIncomingContext %+v", raw, copied)
	}
}
