package stormslog

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/interceptor"
)

// The messages of the lines, constant so that they can be searched for.
const (
	MsgRetryRefused        = "stormguard: retry refused"
	MsgRetryRefusedSummary = "stormguard: retry refused, repeats"
	MsgBreakerChanged      = "stormguard: circuit breaker state changed"
	MsgRetryScheduled      = "stormguard: retry scheduled"
	MsgPushbackSent        = "stormguard: pushback sent"
	MsgTargetDown          = "stormguard: target down"
	MsgTargetUp            = "stormguard: target back up"
	MsgStackedRetry        = "stormguard: stacked retries"

	MsgAdmissionRefused        = "stormguard: request refused"
	MsgAdmissionRefusedSummary = "stormguard: request refused, repeats"
	MsgNotServing              = "stormguard: not serving"
	MsgServing                 = "stormguard: serving on trial"
	MsgHealthSummary           = "stormguard: health changes, repeats"
)

// DefaultInterval is the interval over which refusals of one target for
// one reason are summed up into one line; see WithInterval.
const DefaultInterval = time.Second

// OtherTargets is the target under which refusals are summed up once
// maxKeys targets and reasons are being counted at the same time.
const OtherTargets = "(other targets)"

// maxKeys bounds the number of (target, reason, in_handler) triples counted
// at one time, and so the memory and the lines per interval.
const maxKeys = 1024

// Observer is an interceptor.Observer that logs refused retries, breaker
// and adaptive throttle changes, and a caller's stacked retries to a
// slog.Logger; see the package doc for the lines and levels.
// It is safe for concurrent use. Create it with New.
type Observer struct {
	l        *slog.Logger
	levels   map[interceptor.StopReason]slog.Level
	clk      interface{ Now() time.Time }
	interval time.Duration

	// pending counts the tallies with refusals not yet logged: while it is
	// zero, events other than refusals cost one atomic load here.
	pending atomic.Int64
	// nextSweep is the earliest end of a tally's interval, in
	// nanoseconds of the clock's Unix time; math.MaxInt64 when none.
	nextSweep atomic.Int64

	mu      sync.Mutex
	tallies map[tallyKey]*tally // guarded by mu
	stacked map[string]bool     // methods whose stacked retry was logged; guarded by mu
}

// tallyKey is what refusals are summed up by: a client's refused
// retries by target, reason and in_handler; a server's admission
// refusals by reason; its health changes all together.
type tallyKey struct {
	kind      interceptor.EventKind // EventRetryRefused, EventAdmissionRefused or EventNotServing (health)
	target    string
	reason    interceptor.StopReason
	inHandler bool
	admission interceptor.AdmissionReason
}

// tally counts the refusals of one key since the one that was logged.
type tally struct {
	start   time.Time
	repeats int64 // refusals since the logged one, not logged
	level   slog.Level
	serving bool // health: the state the last change entered
}

// summary is a line to write once the lock is released.
type summary struct {
	key tallyKey
	t   tally
}

var _ interceptor.Observer = (*Observer)(nil)

// Option configures an Observer.
type Option func(*Observer)

// WithLevel logs refusals for reason r at level instead of the default.
func WithLevel(r interceptor.StopReason, level slog.Level) Option {
	return func(o *Observer) { o.levels[r] = level }
}

// WithInterval sets the interval over which refusals of one target for one
// reason are summed up: the first refusal of an interval is logged as it
// happens, and the others of that interval as one summary line with their
// count. Zero logs every refusal, one line each (for tests and debugging).
// The default is DefaultInterval (1 s). A negative d is ignored.
func WithInterval(d time.Duration) Option {
	return func(o *Observer) {
		if d >= 0 {
			o.interval = d
		}
	}
}

// WithClock sets the clock the intervals are measured with, for tests;
// nil is ignored. The default is the system clock.
func WithClock(c interface{ Now() time.Time }) Option {
	return func(o *Observer) {
		if c != nil {
			o.clk = c
		}
	}
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// New returns an Observer that logs to l; nil l means slog.Default().
func New(l *slog.Logger, opts ...Option) *Observer {
	if l == nil {
		l = slog.Default()
	}
	o := &Observer{
		l: l,
		levels: map[interceptor.StopReason]slog.Level{
			interceptor.StopBudget:      slog.LevelWarn,
			interceptor.StopBreakerOpen: slog.LevelWarn,
			interceptor.StopDeadline:    slog.LevelWarn,
			interceptor.StopThrottled:   slog.LevelWarn,
		},
		clk:      systemClock{},
		interval: DefaultInterval,
		tallies:  make(map[tallyKey]*tally),
		stacked:  make(map[string]bool),
	}
	o.nextSweep.Store(noSweep)
	for _, opt := range opts {
		opt(o)
	}
	return o
}

const noSweep = int64(^uint64(0) >> 1)

// level returns the level of a refusal for r: INFO unless set otherwise.
func (o *Observer) level(r interceptor.StopReason) slog.Level {
	if l, ok := o.levels[r]; ok {
		return l
	}
	return slog.LevelInfo
}

// inHandler reports whether ctx is that of a gRPC handler: the call is
// made by a tier serving a request, not by the edge client.
func inHandler(ctx context.Context) bool {
	_, ok := grpc.Method(ctx)
	return ok
}

// Observe logs e if it is worth a line. It implements interceptor.Observer.
func (o *Observer) Observe(ctx context.Context, e interceptor.Event) {
	switch e.Kind {
	case interceptor.EventRetryRefused:
		o.refused(ctx, e)
		return
	case interceptor.EventAdmissionRefused:
		o.admissionRefused(ctx, e)
		return
	case interceptor.EventNotServing, interceptor.EventServing:
		o.health(ctx, e)
		return
	}
	if o.pending.Load() > 0 {
		o.sweep(false)
	}
	var (
		level slog.Level
		msg   string
		attrs [8]slog.Attr
		n     int
	)
	add := func(a slog.Attr) { attrs[n] = a; n++ }
	switch e.Kind {
	case interceptor.EventBreakerStateChange:
		level, msg = slog.LevelInfo, MsgBreakerChanged
		if e.To == breaker.Open {
			level = slog.LevelWarn
		}
		add(slog.String("target", e.Target))
		add(slog.String("from", e.From.String()))
		add(slog.String("to", e.To.String()))
	case interceptor.EventTargetDown:
		level, msg = slog.LevelWarn, MsgTargetDown
		add(slog.String("target", e.Target))
	case interceptor.EventTargetUp:
		level, msg = slog.LevelInfo, MsgTargetUp
		add(slog.String("target", e.Target))
	case interceptor.EventStackedRetry:
		level, msg = slog.LevelWarn, MsgStackedRetry
		if !o.l.Enabled(ctx, level) || !o.firstStacked(e.Method) {
			return
		}
		add(slog.String("method", e.Method))
		add(slog.Int("depth", e.Info.Depth))
		add(slog.Int("attempt", e.Info.Attempt))
	case interceptor.EventRetryScheduled:
		level, msg = slog.LevelDebug, MsgRetryScheduled
		if !o.l.Enabled(ctx, level) {
			return
		}
		add(slog.String("target", e.Target))
		add(slog.String("method", e.Method))
		add(slog.Int("attempt", e.Attempt))
		add(slog.Int("depth", e.Info.Depth))
		add(slog.Bool("in_handler", inHandler(ctx)))
		add(slog.Duration("delay", e.Delay))
	case interceptor.EventPushbackSent:
		level, msg = slog.LevelDebug, MsgPushbackSent
		if !o.l.Enabled(ctx, level) {
			return
		}
		add(slog.String("method", e.Method))
		add(slog.Int("depth", e.Info.Depth))
		add(slog.Int("attempt", e.Info.Attempt))
		add(slog.String("code", e.Code.String()))
	default:
		return
	}
	o.l.LogAttrs(ctx, level, msg, attrs[:n]...)
}

// firstStacked reports whether method's stacked retry is the first the
// Observer sees: a configuration to fix is logged once per method (for
// at most maxKeys methods), not once per request.
func (o *Observer) firstStacked(method string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stacked[method] || len(o.stacked) >= maxKeys {
		return false
	}
	o.stacked[method] = true
	return true
}

// refused logs a refusal, or counts it for the summary of its interval.
func (o *Observer) refused(ctx context.Context, e interceptor.Event) {
	level := o.level(e.Reason)
	if !o.enabledOrSweep(ctx, level) {
		return
	}
	in := inHandler(ctx)
	if o.interval > 0 && !o.first(tallyKey{kind: interceptor.EventRetryRefused, target: e.Target, reason: e.Reason, inHandler: in}, level, false) {
		return
	}
	attrs := [...]slog.Attr{
		slog.String("target", e.Target),
		slog.String("method", e.Method),
		slog.String("reason", reasonName(e.Reason)),
		slog.Int("attempt", e.Attempt),
		slog.Int("depth", e.Info.Depth),
		slog.Bool("in_handler", in),
		slog.String("code", e.Code.String()),
	}
	n := len(attrs)
	if e.Code == codes.OK {
		n-- // no code to show
	}
	o.l.LogAttrs(ctx, level, MsgRetryRefused, attrs[:n]...)
}

// admissionRefused logs a request that admission control refused, or
// counts it for the summary of its interval: WARN (the server is
// overloaded, or a fixed limit is reached), but INFO for a caller that
// was gone.
func (o *Observer) admissionRefused(ctx context.Context, e interceptor.Event) {
	level := slog.LevelWarn
	if e.Admission == interceptor.AdmissionCallerGone {
		level = slog.LevelInfo
	}
	if !o.enabledOrSweep(ctx, level) {
		return
	}
	if o.interval > 0 && !o.first(tallyKey{kind: interceptor.EventAdmissionRefused, admission: e.Admission}, level, false) {
		return
	}
	o.l.LogAttrs(ctx, level, MsgAdmissionRefused,
		slog.String("method", e.Method),
		slog.String("reason", e.Admission.String()),
		slog.String("code", e.Code.String()),
		slog.Int("attempt", e.Info.Attempt))
}

// health logs the server's own health changes (WithHealth): NOT_SERVING
// at WARN, SERVING on trial at INFO. A server that is not serving lets a
// trial in every 200 ms and so changes twice per trial: the changes of
// an interval after its first are summed up, as refusals are, in one
// line that names the state the last of them entered, at its level. A
// SERVING is always a trial's start (a trial whose requests are served
// ends with no event); the message said "serving again" before, and the
// first change of each second of an outage read as a recovery (a user's
// trial).
func (o *Observer) health(ctx context.Context, e interceptor.Event) {
	serving := e.Kind == interceptor.EventServing
	level, msg := slog.LevelWarn, MsgNotServing
	if serving {
		level, msg = slog.LevelInfo, MsgServing
	}
	if !o.enabledOrSweep(ctx, level) {
		return
	}
	if o.interval > 0 && !o.first(tallyKey{kind: interceptor.EventNotServing}, level, serving) {
		return
	}
	o.l.LogAttrs(ctx, level, msg)
}

// enabledOrSweep reports whether level is logged; if not, it still
// writes the summaries that are due.
func (o *Observer) enabledOrSweep(ctx context.Context, level slog.Level) bool {
	if o.l.Enabled(ctx, level) {
		return true
	}
	if o.pending.Load() > 0 {
		o.sweep(false)
	}
	return false
}

// first reports whether the refusal for k is the first of its interval,
// to be logged; otherwise it counts it. It writes the summaries of the
// intervals that are over first.
func (o *Observer) first(k tallyKey, level slog.Level, serving bool) bool {
	now := o.clk.Now()
	o.mu.Lock()
	done := o.sweepLocked(now, false, nil)
	t, ok := o.tallies[k]
	if !ok && len(o.tallies) >= maxKeys {
		k.target = OtherTargets
		t, ok = o.tallies[k]
	}
	if ok {
		t.repeats++
		t.level, t.serving = level, serving // the same for a refusal; a health change's latest
		if t.repeats == 1 {
			o.pending.Add(1)
		}
	} else {
		o.tallies[k] = &tally{start: now, level: level, serving: serving}
		if end := now.Add(o.interval).UnixNano(); end < o.nextSweep.Load() {
			o.nextSweep.Store(end)
		}
	}
	o.mu.Unlock()
	o.write(done)
	return !ok
}

// Flush writes the summary lines of every refusal counted and not yet
// logged, whether or not its interval is over, and starts afresh. Call it
// before the program exits. Without it, a summary is written at the first
// event the Observer receives after its interval ends.
func (o *Observer) Flush() { o.sweep(true) }

// sweep writes the summaries of the intervals that are over, or of all of
// them if all is set.
func (o *Observer) sweep(all bool) {
	now := o.clk.Now()
	if !all && now.UnixNano() < o.nextSweep.Load() {
		return
	}
	o.mu.Lock()
	done := o.sweepLocked(now, all, nil)
	o.mu.Unlock()
	o.write(done)
}

// sweepLocked removes the tallies whose interval is over at now (all of
// them if all is set), appends those with repeats to done and returns it.
// o.mu is held.
func (o *Observer) sweepLocked(now time.Time, all bool, done []summary) []summary {
	if !all && now.UnixNano() < o.nextSweep.Load() {
		return done
	}
	next := noSweep
	for k, t := range o.tallies {
		end := t.start.Add(o.interval)
		if !all && now.Before(end) {
			next = min(next, end.UnixNano())
			continue
		}
		if t.repeats > 0 {
			done = append(done, summary{k, *t})
			o.pending.Add(-1)
		}
		delete(o.tallies, k)
	}
	o.nextSweep.Store(next)
	return done
}

// write logs the summaries, with no lock held, in the order of their keys.
func (o *Observer) write(done []summary) {
	if len(done) == 0 {
		return
	}
	slices.SortFunc(done, func(a, b summary) int {
		return cmp.Or(cmp.Compare(a.key.kind, b.key.kind), cmp.Compare(a.key.target, b.key.target),
			cmp.Compare(a.key.reason, b.key.reason), cmp.Compare(boolInt(a.key.inHandler), boolInt(b.key.inHandler)),
			cmp.Compare(a.key.admission, b.key.admission))
	})
	ctx := context.Background()
	for _, s := range done {
		repeats, interval := slog.Int64("repeats", s.t.repeats), slog.Duration("interval", o.interval)
		switch s.key.kind {
		case interceptor.EventAdmissionRefused:
			o.l.LogAttrs(ctx, s.t.level, MsgAdmissionRefusedSummary,
				slog.String("reason", s.key.admission.String()), repeats, interval)
		case interceptor.EventNotServing:
			o.l.LogAttrs(ctx, s.t.level, MsgHealthSummary,
				slog.String("to", healthState(s.t.serving)), repeats, interval)
		default:
			o.l.LogAttrs(ctx, s.t.level, MsgRetryRefusedSummary,
				slog.String("target", s.key.target),
				slog.String("reason", reasonName(s.key.reason)),
				slog.Bool("in_handler", s.key.inHandler),
				repeats, interval,
			)
		}
	}
}

func healthState(serving bool) string {
	if serving {
		return "SERVING"
	}
	return "NOT_SERVING"
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// reasonName returns the reason's label, the same as stormotel's
// stormguard.reason.
func reasonName(r interceptor.StopReason) string {
	switch r {
	case interceptor.StopNotRetryable:
		return "not_retryable"
	case interceptor.StopAttempts:
		return "attempts"
	case interceptor.StopBudget:
		return "budget"
	case interceptor.StopBreakerOpen:
		return "breaker_open"
	case interceptor.StopTierPolicy:
		return "tier_policy"
	case interceptor.StopPushback:
		return "pushback"
	case interceptor.StopDeadline:
		return "deadline"
	case interceptor.StopCanceled:
		return "canceled"
	case interceptor.StopCommitted:
		return "committed"
	case interceptor.StopThrottled:
		return "throttled"
	}
	return "other"
}
