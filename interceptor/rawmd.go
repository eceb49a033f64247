package interceptor

import (
	"context"

	"google.golang.org/grpc/metadata"
)

// Reading a request's metadata without copying it.
//
// metadata.ValueFromIncomingContext copies the values of every key it
// finds and, for a key that is absent (most of ours, on most requests),
// walks the whole map comparing each key without regard to case. Read
// for the six keys of the protocol (Envoy's included) on every request
// of a middle tier, that was 3 % of the silent check's CPU per request.
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
