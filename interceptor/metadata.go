package interceptor

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/admission"
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
	// MetadataHedging marks a request of a call that hedges (WithHedging):
	// "1" on every attempt of such a call and on every call made while
	// serving one, "2" on a hedge and on every call made while serving
	// one. A tier that receives it does not hedge (a tier above does),
	// and its admission control sheds "2" first (protocol section 2.5).
	MetadataHedging = "x-stormguard-hedging"
	// MetadataTrial marks the calls made while serving a trial: a request
	// that a tier's admission control let in against its overload, after
	// it had served nothing for a while, to see whether it can serve
	// again (admission.Permit.Trial), or a request that carried the mark.
	// "1" on every attempt of such a call. A tier that receives it probes
	// a dependency its adaptive throttle holds down without the probe
	// credit, so that one trial finds out for the whole chain below
	// (protocol section 2.6).
	MetadataTrial = "x-stormguard-trial"
	// MetadataHeld marks the calls made while serving a request that a
	// tier's admission control admitted under the cap of its suspect
	// phase, once that cap had grown because its requests became slower
	// rather than queued (admission.Permit.Held), or a request that
	// carried the mark. "1" on every attempt of such a call. A tier that
	// receives it does not hold the request again in its own suspect
	// phase, up to 8 times its cap in flight (admission.Limiter.WaitHeld):
	// the tier above holds, and its cap bounds what it sends below
	// (protocol section 2.7).
	MetadataHeld = "x-stormguard-held"
)

// Bounds applied to incoming values. Larger values are clamped to them:
// a forged header can only make a tier retry less, never more, under any
// tier policy that does not give a deeper depth or more upstream retries
// more attempts (see TierPolicy).
const (
	MaxDepth           = 64
	MaxAttemptIndex    = 100
	MaxUpstreamRetries = 1000
	maxValueLen        = 8 // longer valid values are the key's maximum, unparsed
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
	// Hedged: a tier above hedges this request (MetadataHedging), so
	// this tier does not hedge its calls for it.
	Hedged bool
	// Hedge: this request is a hedge, or serves one: extra load that
	// admission control sheds before retries.
	Hedge bool
	// Trial: this request is a trial of this tier's admission control
	// (admission.Permit.Trial), or serves one of a tier above
	// (MetadataTrial): this tier's calls for it probe a dependency that
	// its adaptive throttle holds down, and carry the mark on. A trial of
	// this tier's own is marked once admission control let it in:
	// EventRequestReceived, sent before, shows only the mark of a tier
	// above; FromContext in the handler shows both.
	Trial bool
	// Held: this tier's admission control admitted the request under
	// its suspect cap (admission.Permit.Held), or a tier above did
	// (MetadataHeld): the tiers below do not hold it again, and this
	// tier's calls for it carry the mark on. Marked as Trial is.
	Held bool
}

// serverState is what the server interceptor puts into the handler's
// context: the parsed Info, and the mark that a client interceptor sets
// when it gave up on a retryable error, so that the server answers its own
// caller "do not retry".
type serverState struct {
	gaveUp atomic.Bool
	// The Info is parsed on first use (Info): a leaf tier that calls no
	// one, has no observer and is not overloaded never reads the
	// protocol's keys, each of which grpc-go looks up by a walk over all the
	// request's headers when it is absent. (parsed sits next to gaveUp,
	// in one word.)
	parsed atomic.Bool
	epoch  uint64           // WithHealth: the Serving's epoch when the request started
	permit admission.Permit // WithAdmission: a unary call's slot until its handler returns

	mu     sync.Mutex // serializes the parse
	srv    *server    // nil: info was given, not parsed
	in     context.Context
	method string
	info   Info
}

// markAdmitted records in the request's Info what its admission told of
// it: a trial (admission.Permit.Trial), or admitted under the suspect
// cap (admission.Permit.Held). It is called before the handler runs, and
// parses the Info first, which would otherwise overwrite the marks.
func (st *serverState) markAdmitted(p admission.Permit) {
	if !p.Trial() && !p.Held() {
		return
	}
	st.Info()
	st.mu.Lock()
	st.info.Trial = st.info.Trial || p.Trial()
	st.info.Held = st.info.Held || p.Held()
	st.mu.Unlock()
}

// Info returns the Info of the request, parsing it on the first call.
func (st *serverState) Info() Info {
	if st.srv == nil || st.parsed.Load() {
		return st.info
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.parsed.Load() {
		st.info = st.srv.parseInfo(st.in, st.method)
		st.parsed.Store(true)
	}
	return st.info
}

type stateKey struct{}

// stateCtx carries a serverState. It is one allocation where
// context.WithValue plus the state would be two.
type stateCtx struct {
	context.Context
	st       serverState
	mark     uintptr // where a unary handler's stack was before it ran (see stackroom.go)
	running  bool    // a unary handler runs (see server.unary)
	roomMade bool    // room was made on the stack for the handler
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
		return st.Info(), true
	}
	return Info{}, false
}

// parseInfo reads the attempt metadata of an incoming request through get,
// which returns the values of a key as metadata.MD.Get does. Repeated keys
// take the largest valid value, and large values are clamped. A key that is
// present but malformed (negative, non-numeric, empty) counts as the
// cautious value: a caller that is retrying (attempt and upstream retries
// 1) at the deepest depth (MaxDepth). Since a policy never allows more
// attempts for a deeper depth or for upstream retries (see TierPolicy), no
// header can make this tier, or a tier below it, retry more than an honest
// request (no header at the edge) would.
func parseInfo(get func(key string) []string) Info {
	attempt := max(cautious(get(MetadataAttempt), MaxAttemptIndex, 1),
		cautious(get(MetadataPreviousAttempts), MaxAttemptIndex, 1))
	hedging := cautious(get(MetadataHedging), hedgeMark, hedgeMark)
	return Info{
		Depth:           cautious(get(MetadataDepth), MaxDepth, MaxDepth),
		Attempt:         attempt,
		UpstreamRetries: min(cautious(get(MetadataUpstreamRetries), MaxUpstreamRetries, 1)+attempt, MaxUpstreamRetries),
		Hedged:          hedging >= hedgingMark,
		Hedge:           hedging >= hedgeMark,
		// A malformed mark reads as none, the cautious value: no probe
		// beyond the credit.
		Trial: cautious(get(MetadataTrial), 1, 0) == 1,
		// Malformed: none, the cautious value: held as any request.
		Held: cautious(get(MetadataHeld), 1, 0) == 1,
	}
}

// The values of MetadataHedging. A malformed one reads as hedgeMark, the
// cautious value: no hedging below it, shed first.
const (
	hedgingMark = 1
	hedgeMark   = 2
)

// cautious returns the largest valid value among vals, clamped to limit,
// or at least ifInvalid when any value is malformed; 0 when vals is empty.
func cautious(vals []string, limit, ifInvalid int) int {
	best := 0
	for _, v := range vals {
		n, ok := parseCount(v, limit)
		if !ok {
			n = ifInvalid
		}
		best = max(best, n)
	}
	return best
}

// incomingInfo parses the Info of the request whose metadata in reads.
// stacked reports a request that carries both stormguard's attempt
// metadata (x-call-depth or x-retry-attempt) and grpc-go's
// grpc-previous-rpc-attempts: a retrying client interceptor with grpc-go's
// built-in retry still on underneath (see stackedRetry).
func incomingInfo(in incoming) (info Info, stacked bool) {
	var ours, builtin bool
	info = parseInfo(func(key string) []string {
		v := in.get(key)
		if len(v) > 0 {
			switch key {
			case MetadataDepth, MetadataAttempt:
				ours = true
			case MetadataPreviousAttempts:
				builtin = true
			}
		}
		return v
	})
	return info, ours && builtin
}

// parseCount parses a small non-negative decimal: after trimming spaces,
// one or more decimal digits, nothing else (a sign, "+2" or "-0", is
// malformed: protocol 2.1, section 3). Values longer than maxValueLen
// digits are clamped to limit.
func parseCount(v string, limit int) (int, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	if len(v) > maxValueLen {
		return limit, true
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, false
	}
	return min(n, limit), true
}

// pushback reads the gRFC A6 pushback trailer (protocol section 4). It
// returns (delay ms, true) for a single non-negative value, and (-1, true)
// for "do not retry": a negative value, a malformed one, or more than
// one. A value is, after trimming spaces and tabs (nothing else: "250"
// and a no-break space is malformed), an optional sign and decimal
// digits within 64 bits: "+250" is 250, "0250" is 250, and "-0" is 0, a
// retry at once, as every gRPC's A6 code reads it. (0, false) means no
// pushback was sent.
func pushback(trailer metadata.MD) (ms int64, ok bool) {
	vals := trailer[MetadataPushback]
	switch len(vals) {
	case 0:
		return 0, false
	case 1:
		n, err := strconv.ParseInt(strings.Trim(vals[0], " \t"), 10, 64)
		if err != nil || n < 0 {
			return -1, true
		}
		return n, true
	default:
		return -1, true
	}
}
