package interceptor

import (
	"context"
	"fmt"

	"google.golang.org/grpc/metadata"
)

// Reading a request's metadata without copying it.
//
// metadata.ValueFromIncomingContext copies the values of every key it
// finds and, for a key that is absent (most of ours, on most requests),
// walks the whole map comparing each key without regard to case. Read
// for the keys of the protocol (six then, Envoy's included) on every
// request of a middle tier, that was 3 % of the silent check's CPU per
// request.
// grpc-go keeps the incoming metadata in the context as a metadata.MD
// under a key of its own type; ValueFromIncomingContext asks the context
// for that key, so asking it once through a context that records the key
// it is asked for gives us the key, and ctx.Value(key) the map itself,
// which we only read. The keys gRPC delivers are lower case (HTTP/2
// header names are, and metadata.New, Pairs and AppendToOutgoingContext
// lower-case theirs), so that a lookup by our lower-case keys finds
// them. (A hand-built metadata.MD with an upper-case key, given to
// NewIncomingContext in process, is not read: such a key reads as
// absent, like a header that HTTP/2 would have refused.)
//
// Should a grpc-go release keep the metadata otherwise, the check in
// init finds it and every lookup goes through ValueFromIncomingContext
// again (TestIncomingMetadataRaw says so first).

// incomingKey is grpc-go's context key of the incoming metadata, or nil
// when it could not be learnt (see above).
var incomingKey = learnIncomingKey()

// keySpy is a context that records the last key it was asked for.
type keySpy struct {
	context.Context
	key *any
}

func (s keySpy) Value(key any) any {
	*s.key = key
	return nil
}

// learnIncomingKey returns the key under which metadata.NewIncomingContext
// keeps its MD, after checking that ctx.Value of it returns that MD.
func learnIncomingKey() any {
	var key any
	metadata.ValueFromIncomingContext(keySpy{Context: context.Background(), key: &key}, MetadataDepth)
	if key == nil {
		return nil
	}
	want := metadata.Pairs(MetadataDepth, "1")
	got, ok := metadata.NewIncomingContext(context.Background(), want).Value(key).(metadata.MD)
	if !ok || len(got) != 1 || len(got[MetadataDepth]) != 1 || &got[MetadataDepth][0] != &want[MetadataDepth][0] {
		return nil
	}
	return key
}

// incoming reads keys of the incoming metadata of one request.
type incoming struct {
	ctx context.Context
	md  metadata.MD // grpc-go's own map, never written; nil: use ctx
	raw bool
}

func incomingOf(ctx context.Context) incoming {
	if incomingKey != nil {
		md, _ := ctx.Value(incomingKey).(metadata.MD)
		return incoming{ctx: ctx, md: md, raw: true}
	}
	return incoming{ctx: ctx}
}

// get returns the values of key (lower case), which the caller must not
// modify.
func (in incoming) get(key string) []string {
	if in.raw {
		return in.md[key]
	}
	return metadata.ValueFromIncomingContext(in.ctx, key)
}

// Writing an attempt's metadata without building it per attempt.
//
// metadata.AppendToOutgoingContext copies its pairs into a new value and
// wraps the context around it: four allocations per attempt, on every
// call a middle tier makes. Most first attempts carry the same few pairs
// (x-call-depth with a small depth, the hedging mark, or both) on a
// caller's context that carries no outgoing metadata of its own, and for
// those the value grpc-go keeps is always the same: it is made once per
// combination (learnShared, with AppendToOutgoingContext itself), and
// the attempt's context is an mdContext, kept in the call's own
// allocation, that answers grpc-go's key with it. grpc-go only reads that
// value, and a context that adds metadata on top of it copies what it
// adds (TestOutgoingMetadataShared). As for the incoming key, a grpc-go
// release that keeps outgoing metadata otherwise makes learnOutgoingKey
// or learnShared fail, and every attempt goes through
// AppendToOutgoingContext again (TestOutgoingMetadataShared says so
// first).

// maxSharedDepth is the deepest x-call-depth whose metadata is shared;
// deeper chains build theirs per attempt.
const maxSharedDepth = 16

// outgoingKey is grpc-go's context key of outgoing metadata, or nil.
var outgoingKey = learnOutgoingKey()

// sharedMD[depth][mark] is the value AppendToOutgoingContext gives a
// context without metadata for a first attempt's pairs at depth (0:
// none) with the hedging mark (0: none); nil when it could not be
// learnt.
var sharedMD = learnShared()

func learnOutgoingKey() any {
	var key any
	metadata.FromOutgoingContext(keySpy{Context: context.Background(), key: &key})
	return key
}

// learnShared makes sharedMD, and checks that each value reads back,
// through an mdContext, as its pairs.
func learnShared() *[maxSharedDepth + 1][hedgeMark + 1]any {
	if outgoingKey == nil {
		return nil
	}
	var vals [maxSharedDepth + 1][hedgeMark + 1]any
	for d := range vals {
		for m := range vals[d] {
			kv := attemptPairs(nil, 0, d, 0, m, false, false)
			if len(kv) == 0 {
				continue
			}
			vals[d][m] = metadata.AppendToOutgoingContext(context.Background(), kv...).Value(outgoingKey)
			got, ok := metadata.FromOutgoingContext(&mdContext{Context: context.Background(), md: &vals[d][m]})
			if vals[d][m] == nil || !ok || len(got) != len(kv)/2 {
				return nil
			}
			for i := 0; i < len(kv); i += 2 {
				if v := got[kv[i]]; len(v) != 1 || v[0] != kv[i+1] {
					return nil
				}
			}
		}
	}
	return &vals
}

// mdContext is a context whose outgoing metadata is *md, a value of
// sharedMD (a pointer: the context lives in the call's allocation, which
// it keeps in a smaller size class).
type mdContext struct {
	context.Context
	md *any
}

func (c *mdContext) Value(key any) any {
	if key == outgoingKey {
		return *c.md
	}
	return c.Context.Value(key)
}

// String names the context as the context package names its own.
func (c *mdContext) String() string {
	return fmt.Sprint(c.Context) + ".WithAttemptMetadata"
}

// withShared returns ctx with the outgoing metadata {x-call-depth: depth}
// (none for 0) and {x-stormguard-hedging: mark} (none for 0), made in
// into, and true; or false when that metadata is not shared (see above;
// no metadata at all is not shared either) or ctx carries outgoing
// metadata of its own.
func withShared(into *mdContext, ctx context.Context, depth, mark int) (context.Context, bool) {
	if sharedMD == nil || depth < 0 || depth > maxSharedDepth || mark < 0 || mark > hedgeMark ||
		sharedMD[depth][mark] == nil || ctx.Value(outgoingKey) != nil {
		return nil, false
	}
	*into = mdContext{Context: ctx, md: &sharedMD[depth][mark]}
	return into, true
}
