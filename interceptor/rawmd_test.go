package interceptor

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
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

// The first attempts whose metadata is shared (withShared) send exactly
// what AppendToOutgoingContext would have, and a context that carries
// the caller's own outgoing metadata is never given shared metadata.
// Were grpc-go's outgoing key not found, every attempt would still send
// the right metadata, built per attempt; this test says so first.
func TestOutgoingMetadataShared(t *testing.T) {
	if outgoingKey == nil || sharedMD == nil {
		t.Fatal("grpc-go's outgoing metadata was not learnt: every attempt builds its own with AppendToOutgoingContext")
	}
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "caller's")
	for depth := 0; depth <= maxSharedDepth+1; depth++ {
		for mark := 0; mark <= hedgeMark; mark++ {
			kv := attemptPairs(nil, 0, depth, 0, mark, false, false)
			var into mdContext
			ctx, ok := withShared(&into, parent, depth, mark)
			if want := depth <= maxSharedDepth && len(kv) > 0; ok != want {
				t.Fatalf("depth %d, mark %d: shared %v, want %v", depth, mark, ok, want)
			}
			if !ok {
				continue
			}
			got, _ := metadata.FromOutgoingContext(ctx)
			want, _ := metadata.FromOutgoingContext(metadata.AppendToOutgoingContext(parent, kv...))
			if !mdEqual(got, want) {
				t.Fatalf("depth %d, mark %d: shared metadata %v, AppendToOutgoingContext %v", depth, mark, got, want)
			}
			if v := ctx.Value(key{}); v != "caller's" {
				t.Fatalf("depth %d, mark %d: the caller's value reads %v", depth, mark, v)
			}
		}
	}
	// Metadata added on top of one shared value is the adder's alone, and
	// the shared value is unchanged.
	var into mdContext
	shared, _ := withShared(&into, parent, 2, hedgingMark)
	a := metadata.AppendToOutgoingContext(shared, "x-a", "1")
	b := metadata.AppendToOutgoingContext(shared, "x-b", "2")
	mdA, _ := metadata.FromOutgoingContext(a)
	mdB, _ := metadata.FromOutgoingContext(b)
	mdA[MetadataDepth][0] = "edited" // FromOutgoingContext's copy
	again, _ := metadata.FromOutgoingContext(shared)
	if len(mdA) != 3 || mdB["x-a"] != nil || mdB["x-b"][0] != "2" || !mdEqual(again, metadata.Pairs(MetadataDepth, "2", MetadataHedging, "1")) {
		t.Fatalf("added on one shared value: %v and %v; the shared value now reads %v", mdA, mdB, again)
	}
	if s := fmt.Sprint(shared); !strings.HasSuffix(s, ".WithAttemptMetadata") {
		t.Fatalf("the attempt's context prints as %q", s)
	}
	own := metadata.AppendToOutgoingContext(parent, "x-user", "1")
	if _, ok := withShared(&mdContext{}, own, 1, 0); ok {
		t.Fatal("a context with the caller's own outgoing metadata was given shared metadata, which would drop the caller's")
	}
}

func mdEqual(a, b metadata.MD) bool { return maps.EqualFunc(a, b, slices.Equal[[]string]) }

// A middle tier's first attempt of a call sends x-call-depth without an
// allocation when the call gives it room; a retry, or a call whose
// context carries metadata of the caller's own, builds its metadata,
// and the caller's metadata goes out with it.
func TestFirstAttemptMetadataAllocatesNothing(t *testing.T) {
	cfg := defaultConfig()
	sc := &stateCtx{Context: context.Background()}
	sc.st.info = Info{Depth: 2}
	var c call
	c.init(sc, &cfg, "passthrough:///next", "/svc/M")
	var into mdContext
	first := func() { c.attempt = 0; c.attemptContext(false, &into) }
	if n := testing.AllocsPerRun(100, first); n != 0 {
		t.Fatalf("a first attempt's metadata: %v allocations, want 0", n)
	}
	built := func() { c.attempt = 0; c.attemptContext(false, nil) }
	if n := testing.AllocsPerRun(100, built); n == 0 {
		t.Fatal("metadata built per attempt allocated nothing: the test measures nothing")
	}
	c.attempt = 0
	ctx, _ := c.attemptContext(false, &into)
	if md, _ := metadata.FromOutgoingContext(ctx); !mdEqual(md, metadata.Pairs(MetadataDepth, "3")) {
		t.Fatalf("first attempt sent %v, want x-call-depth: 3", md)
	}
	ctx, _ = c.attemptContext(false, &into) // a retry
	if md, _ := metadata.FromOutgoingContext(ctx); !mdEqual(md, metadata.Pairs(MetadataDepth, "3", MetadataAttempt, "1")) {
		t.Fatalf("retry sent %v, want x-call-depth: 3, x-retry-attempt: 1", md)
	}
	var own call
	own.init(metadata.AppendToOutgoingContext(sc, "x-user", "a"), &cfg, "passthrough:///next", "/svc/M")
	ctx, _ = own.attemptContext(false, &into)
	if md, _ := metadata.FromOutgoingContext(ctx); !mdEqual(md, metadata.Pairs(MetadataDepth, "3", "x-user", "a")) {
		t.Fatalf("with the caller's metadata, sent %v, want x-call-depth: 3, x-user: a", md)
	}
}
