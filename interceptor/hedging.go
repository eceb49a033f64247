package interceptor

import (
	"math"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/stormguard/stormguard/hedge"
	"github.com/stormguard/stormguard/internal/keyed"
)

// MaxHedges is the most hedges per call that WithHedging accepts.
const MaxHedges = MaxAttempts - 1

// Hedging configures hedged requests (see WithHedging). The zero value
// hedges every method of the interceptor once, after an adaptive delay.
type Hedging struct {
	// Delay is the wait after an attempt went out before a hedge is sent
	// while no answer came. Zero means adaptive: the Adaptive.Percentile
	// (95th) of the recent latencies of the target's first attempts for
	// this method, and Adaptive.Initial (50 ms) until Adaptive.MinSamples
	// (100) of them came (see hedge.Config). Valid: >= 0.
	Delay time.Duration
	// MaxHedges is the most hedges per call (attempts sent while another
	// is in flight). Zero means 1. Valid: 1 to MaxHedges. All attempts
	// of a call, hedges and retries, stay within WithMaxAttempts and the
	// tier policy: a call allowed one attempt is not hedged.
	MaxHedges int
	// Adaptive configures the adaptive delay (Delay zero). Only New
	// accepts it: the latencies are kept per target and method by the
	// interceptor, and a call with WithHedging uses the interceptor's
	// (hedge.Config's defaults without one).
	Adaptive hedge.Config
	// Methods are the full method names hedged ("/pkg.Service/Method");
	// empty means every method of the interceptor (per call: the call).
	// Hedge only idempotent methods: the target may run both attempts.
	Methods []string
}

// hedging is a normalized Hedging.
type hedging struct {
	delay     time.Duration // zero: adaptive
	maxHedges int
	methods   map[string]bool // nil: all
}

// WithHedging hedges unary calls: when no answer came within the hedge
// delay, the call sends another attempt (a hedge) while the first is in
// flight, up to Hedging.MaxHedges; the first answer that succeeds, fails
// with a code that is not retried, or arrived with response headers
// (gRFC A6: it committed the call) is the call's, and the other attempts
// are cancelled. A failure with a retried code while another attempt is
// in flight leaves that one to answer and sends the next hedge at once
// (if one is left; after a positive pushback, once it passed); a "do not
// retry" answer stops the hedges. A call whose attempts all failed retries as any other (its
// hedges count as its attempts).
//
// A hedge is a retry to every mechanism: it spends the retry budget (or
// A6 throttle) and passes the adaptive throttle's retry rule, which sends
// retries only to a healthy target that is not being shed; a breaker that
// is open stops it. So hedges stop while the target is busy or down.
// Three rules of its own stop hedges where they would only add load. No
// hedge goes to a target whose recent median latency is more than twice
// its lowest lately: it is queueing (at capacity from a fixed number of
// callers, or overloaded; hedge.Delay.Queueing), and a hedge would wait
// in the same queue (EventHedgeRefused with StopQueueing, for each call
// that outlasted its hedge delay). A target whose latency rose for good
// (a slower deploy, healthy) reads as queueing too, until the lowest
// median follows it up: a user's trial measured 8 s without hedges after
// a 3x step, 16 s after a 5x one. And hedges go
// out only while at least one in ten of the target's recent hedges (for
// the method, decayed with a half-life of 2 s) answered before the
// attempts sent earlier, or while fewer than ten were sent lately: a
// hedge that loses is extra load and nothing else (StopHedgesLost). And
// the target's recent hedges (for the method, decayed the same) stay
// below 1 - Adaptive.Percentile (5 % by default, with a fixed Delay too)
// of its recent calls, plus one: a target that slows down at once
// outlasts a delay learnt from its latencies before, and hedges sent
// into its growing queue make it slower still (StopHedgeShare). To let
// more calls hedge, lower Adaptive.Percentile; it is the interceptor's
// (give WithHedging to New, with Methods naming the methods, if calls
// should hedge only per call: per call it cannot be given). A target
// whose handlers run on after a cancel (a worker pool that does not watch
// the context) keeps a worker for each losing attempt: near such a
// pool's capacity, hedging within these rules can still raise the p99 (a
// user's trial at 85 % of a pool of 4: 0.77-1.41x of the p99 without
// hedging over three runs, 0.87-1.85x before the share rule). While any
// of these rules says no when a call starts, the call starts no hedge
// timer and costs only the mark more than a call that does not hedge;
// the rules are asked again when a hedge is due (the refusal events are
// those of hedges due).
//
// Every attempt of a call that hedges carries MetadataHedging: the tiers
// below do not hedge the same request (a tier that hedges stops those
// below it from hedging), and a hedge reads as a retry (x-retry-attempt),
// so the tiers below make one attempt for it, and their admission control
// sheds hedges before retries. One slow request costs the slow tier at
// most 1 + MaxHedges calls, however deep it is and however many tiers
// hedge.
//
// Each hedge gets its own reply message, copied into the caller's when it
// wins (after the other attempts returned); a reply that is not a
// proto.Message is not hedged. The caller's grpc.Header, grpc.Trailer and
// grpc.Peer options (values or pointers) receive the winning attempt's;
// every other call option goes to each attempt, so that a callback such
// as grpc.OnFinish runs once per attempt, on the attempts' goroutines,
// at the same time for attempts in flight together. Streams are not
// hedged (see the package documentation).
//
// What it costs: a hedging call that sends no hedge has a cancellable
// context and the header of the mark more than one that does not hedge
// (its timer comes from a pool and goes back to it), about 9
// allocations and 5 % of the time of a call on one tier over bufconn
// (BENCHMARKS.md, "Hedging"). Configure it where the tail matters.
//
// Client side; usable per call (without Hedging.Adaptive), so that one
// call of an idempotent method may hedge: client.Get(ctx, req,
// interceptor.WithHedging(interceptor.Hedging{})). Not part of
// Recommended: hedge idempotent methods only.
func WithHedging(h Hedging) Option {
	return Option{apply: func(c *config) error {
		n, err := h.normalize()
		if err != nil {
			return err
		}
		if c.delays != nil && h.Adaptive != (hedge.Config{}) {
			return invalid("WithHedging: Hedging.Adaptive is not usable per call (the latencies are the interceptor's): give it to New")
		}
		if c.delays == nil {
			if _, err := hedge.New(h.Adaptive); err != nil {
				return invalid("WithHedging: %v", err)
			}
			c.hedgeAdaptive = h.Adaptive
		}
		c.hedging = n
		return nil
	}}
}

func (h Hedging) normalize() (*hedging, error) {
	n := &hedging{delay: h.Delay, maxHedges: h.MaxHedges}
	switch {
	case h.Delay < 0:
		return nil, invalid("WithHedging: Delay %v, want >= 0 (0: adaptive)", h.Delay)
	case h.MaxHedges < 0 || h.MaxHedges > MaxHedges:
		return nil, invalid("WithHedging: MaxHedges %d, want 1 to %d (0: 1)", h.MaxHedges, MaxHedges)
	case h.MaxHedges == 0:
		n.maxHedges = 1
	}
	if len(h.Methods) > 0 {
		n.methods = make(map[string]bool, len(h.Methods))
		for _, m := range h.Methods {
			if len(m) < 3 || m[0] != '/' {
				return nil, invalid("WithHedging: method %q, want a full method name such as \"/pkg.Service/Method\"", m)
			}
			n.methods[m] = true
		}
	}
	return n, nil
}

// hedges reports whether a call to method hedges.
func (h *hedging) hedges(method string) bool {
	return h != nil && (h.methods == nil || h.methods[method])
}

// hedges reports whether call c, to a method that WithHedging names
// and whose reply can be hedged, hedges: it may make more than one
// attempt, and no tier above hedges the request it serves.
func (c *call) hedges() bool { return c.max > 1 && !c.info.Hedged }

// maxDelaysPerTarget bounds the methods whose hedging state is kept per
// target; a method past it is not hedged.
const maxDelaysPerTarget = 256

// delaySet holds the hedging state, per target key and method.
type delaySet struct {
	cfg     hedge.Config
	share   float64 // the most hedges per call: 1 - the Percentile
	targets keyed.Map[*methodDelays]
}

type methodDelays struct {
	mu sync.RWMutex
	m  map[string]*hedgeTarget
}

// hedgeTarget is the hedging state of one target and method: its
// adaptive delay, how often its recent hedges answered first, and how
// many calls they came from.
type hedgeTarget struct {
	delay *hedge.Delay
	share float64 // see delaySet

	mu        sync.Mutex
	sent, won float64 // recent hedges, decayed with a half-life of winHalfLife
	leads     float64 // recent calls that could hedge, decayed the same
	at        time.Time
}

// The win rule: a hedge goes out only while at least minWinShare of the
// target's recent hedges answered before the attempts sent earlier (or
// while fewer than winTrial were sent lately, which lets hedging try
// again after it stopped). A hedge that loses is pure extra load: at a
// target where every request waits in one queue (at capacity, from a
// fixed number of callers) a hedge joins the back of the queue and
// never wins.
const (
	minWinShare = 0.1
	winTrial    = 10
	winHalfLife = 2 * time.Second
)

func newDelaySet(cfg hedge.Config) *delaySet {
	p := cfg.Percentile
	if p == 0 {
		p = hedge.DefaultPercentile
	}
	s := &delaySet{cfg: cfg, share: 1 - p}
	s.targets.Max = maxLimiterKeys
	return s
}

// get returns the hedging state of method at key, created on first use,
// or nil when the target keeps too many methods already.
func (s *delaySet) get(key, method string) *hedgeTarget {
	md := s.targets.Get(key, func() *methodDelays { return &methodDelays{m: map[string]*hedgeTarget{}} })
	md.mu.RLock()
	ht := md.m[method]
	md.mu.RUnlock()
	if ht != nil {
		return ht
	}
	md.mu.Lock()
	defer md.mu.Unlock()
	if ht = md.m[method]; ht == nil && len(md.m) < maxDelaysPerTarget {
		d, _ := hedge.New(s.cfg) // validated by WithHedging
		ht = &hedgeTarget{delay: d, share: s.share}
		md.m[method] = ht
	}
	return ht
}

// decay ages the counts to now. ht.mu is held.
func (ht *hedgeTarget) decay(now time.Time) {
	if dt := now.Sub(ht.at); dt > 0 {
		f := math.Exp2(-float64(dt) / float64(winHalfLife))
		ht.sent, ht.won, ht.leads, ht.at = ht.sent*f, ht.won*f, ht.leads*f, now
	}
}

// allows reports why a hedge may not go out by the win rule or the share
// rule, or zero; lead counts a call's attempt that could be hedged.
//
// The share rule: recent hedges stay below share (1 - the delay's
// Percentile, 5 % by default) of the recent calls, plus one. The delay
// is a percentile of latencies of up to a Window ago: when the target
// slows down at once (its queue grows near capacity), many more calls
// than that outlast it, and each hedge adds to the queue that made them
// slow; a user's trial at 85 % of a worker pool's capacity, whose
// handlers ran on after a cancel, hedged 7-21 % of its calls, held back
// only by the retry budget, and its p99 was 1.5-6x that without hedging.
func (ht *hedgeTarget) allows(now time.Time, lead bool) StopReason {
	ht.mu.Lock()
	defer ht.mu.Unlock()
	ht.decay(now)
	if lead {
		ht.leads++
	}
	switch {
	case ht.sent >= winTrial && ht.won < minWinShare*ht.sent:
		return StopHedgesLost
	case ht.sent >= ht.share*ht.leads+1:
		return StopHedgeShare
	}
	return 0
}

// count records a hedge sent, or one that won.
func (ht *hedgeTarget) count(now time.Time, won bool) {
	ht.mu.Lock()
	defer ht.mu.Unlock()
	ht.decay(now)
	if won {
		ht.won++
	} else {
		ht.sent++
	}
}

// hedgeDelay returns the delay before the call's next hedge.
func (c *call) hedgeDelay(ht *hedgeTarget) time.Duration {
	d := ht.delay.Get() // with a fixed delay too: it keeps the median for Queueing
	if h := c.cfg.hedging; h.delay > 0 {
		return h.delay
	}
	return d
}

// hedgeableReply reports whether reply can be hedged: each hedge needs
// a fresh message of its type.
func hedgeableReply(reply any) bool {
	_, ok := reply.(proto.Message)
	return ok
}

// replyType returns the type of reply, to make a fresh one for each
// hedge. Call it before the lead attempt goes out: reading the type of
// a message being unmarshaled races with the unmarshal.
func replyType(reply any) protoreflect.MessageType {
	return reply.(proto.Message).ProtoReflect().Type()
}

// copyReply makes dst, the caller's reply, the winning attempt's src.
func copyReply(dst, src any) {
	d := dst.(proto.Message)
	proto.Reset(d)
	proto.Merge(d, src.(proto.Message))
}
