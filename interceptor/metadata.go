package interceptor

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/metadata"
)

// The metadata protocol. Keys are lower case, as gRPC requires.
const (
	// MetadataAttempt is this hop's attempt index: absent on the first
	// attempt, "1" on the first retry. go-grpc-middleware's retry sends the
	// same key with the same meaning, so its clients are understood.
	MetadataAttempt = "x-retry-attempt"
	// MetadataDepth is the number of hops from the edge. A server that
	// receives none is the edge (depth 0); its outgoing calls carry 1.
	MetadataDepth = "x-call-depth"
	// MetadataUpstreamRetries is the number of retries in progress on the
	// path above the receiving tier's caller.
	MetadataUpstreamRetries = "x-upstream-retries"
	// MetadataPreviousAttempts is set by grpc-go's built-in retry on its
	// retries; it is read like MetadataAttempt.
	MetadataPreviousAttempts = "grpc-previous-rpc-attempts"
	// MetadataPushback is the gRFC A6 trailer by which a server tells its
	// client when to retry: a non-negative number of milliseconds, or a
	// negative number for "do not retry".
	MetadataPushback = "grpc-retry-pushback-ms"
)

// Bounds applied to incoming values. Larger values are clamped to them:
// a forged header can only make a tier retry less, never more.
const (
	MaxDepth           = 64
	MaxAttemptIndex    = 100
	MaxUpstreamRetries = 1000
	maxValueLen        = 8 // longer values are ignored unparsed
)

// Info is what a tier knows about the request it is serving, parsed from
// the incoming metadata by the server interceptor.
type Info struct {
	// Depth is this tier's distance from the edge: 0 for the edge.
	Depth int
	// Attempt is the caller's attempt index for this request: 0 for its
	// first attempt, 1 for its first retry.
	Attempt int
	// UpstreamRetries counts retries in progress on the path above this
	// tier, including the caller's own (Attempt). A tier that sees more
	// than zero does not retry by default.
	UpstreamRetries int
}

// serverState is what the server interceptor puts into the handler's
// context: the parsed Info, and the mark that a client interceptor sets
// when it gave up on a retryable error, so that the server answers its own
// caller "do not retry".
type serverState struct {
	info   Info
	gaveUp atomic.Bool
}

type stateKey struct{}

// stateCtx carries a serverState. It is one allocation where
// context.WithValue plus the state would be two.
type stateCtx struct {
	context.Context
	st serverState
}

func (c *stateCtx) Value(key any) any {
	if key == (stateKey{}) {
		return &c.st
	}
	return c.Context.Value(key)
}

func stateFrom(ctx context.Context) *serverState {
	st, _ := ctx.Value(stateKey{}).(*serverState)
	return st
}

// FromContext returns the Info of the request a handler is serving, and
// false when ctx did not come through the server interceptor.
func FromContext(ctx context.Context) (Info, bool) {
	if st := stateFrom(ctx); st != nil {
		return st.info, true
	}
	return Info{}, false
}

// parseInfo reads the attempt metadata of an incoming request. Absent,
// malformed, negative or overlong values count as zero; repeated keys take
// the largest valid value; large values are clamped. So no header can make
// this tier retry more than an honest one would.
// get returns the values of a key, as metadata.MD.Get does.
func parseInfo(get func(key string) []string) Info {
	attempt := max(maxValue(get(MetadataAttempt), MaxAttemptIndex),
		maxValue(get(MetadataPreviousAttempts), MaxAttemptIndex))
	return Info{
		Depth:           maxValue(get(MetadataDepth), MaxDepth),
		Attempt:         attempt,
		UpstreamRetries: min(maxValue(get(MetadataUpstreamRetries), MaxUpstreamRetries)+attempt, MaxUpstreamRetries),
	}
}

// incomingInfo parses the Info of the request ctx serves. It looks up the
// four keys one by one rather than copying the whole incoming metadata.
func incomingInfo(ctx context.Context) Info {
	return parseInfo(func(key string) []string { return metadata.ValueFromIncomingContext(ctx, key) })
}

// maxValue returns the largest valid non-negative integer among vals,
// clamped to limit; 0 when none is valid.
func maxValue(vals []string, limit int) int {
	best := 0
	for _, v := range vals {
		if n, ok := parseCount(v, limit); ok && n > best {
			best = n
		}
	}
	return best
}

// parseCount parses a small non-negative decimal. Values longer than
// maxValueLen digits are clamped to limit when they are all digits, and
// rejected otherwise.
func parseCount(v string, limit int) (int, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if len(v) > maxValueLen {
		for i := 0; i < len(v); i++ {
			if v[i] < '0' || v[i] > '9' {
				return 0, false
			}
		}
		return limit, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, false
	}
	return min(n, limit), true
}

// pushback reads the gRFC A6 pushback trailer. It returns (delay ms, true)
// for a single non-negative value, and (-1, true) for "do not retry": a
// negative value, a malformed one, or more than one, as grpc-go treats
// them. (0, false) means no pushback was sent.
func pushback(trailer metadata.MD) (ms int64, ok bool) {
	vals := trailer[MetadataPushback]
	switch len(vals) {
	case 0:
		return 0, false
	case 1:
		v := strings.TrimSpace(vals[0])
		if len(v) > 19 {
			return -1, true
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return -1, true
		}
		return n, true
	default:
		return -1, true
	}
}
