package stormslog

import (
	"context"
	"log/slog"

	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/interceptor"
)

// The messages of the lines, constant so that they can be searched for.
const (
	MsgRetryRefused   = "stormguard: retry refused"
	MsgBreakerChanged = "stormguard: circuit breaker state changed"
	MsgRetryScheduled = "stormguard: retry scheduled"
	MsgPushbackSent   = "stormguard: pushback sent"
)

// Observer is an interceptor.Observer that logs refused retries and breaker
// changes to a slog.Logger; see the package doc for the lines and levels.
// It is safe for concurrent use. Create it with New.
type Observer struct {
	l      *slog.Logger
	levels map[interceptor.StopReason]slog.Level
}

var _ interceptor.Observer = (*Observer)(nil)

// Option configures an Observer.
type Option func(*Observer)

// WithLevel logs refusals for reason r at level instead of the default.
func WithLevel(r interceptor.StopReason, level slog.Level) Option {
	return func(o *Observer) { o.levels[r] = level }
}

// New returns an Observer that logs to l; nil l means slog.Default().
func New(l *slog.Logger, opts ...Option) *Observer {
	if l == nil {
		l = slog.Default()
	}
	o := &Observer{l: l, levels: map[interceptor.StopReason]slog.Level{
		interceptor.StopBudget:      slog.LevelWarn,
		interceptor.StopBreakerOpen: slog.LevelWarn,
		interceptor.StopDeadline:    slog.LevelWarn,
	}}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// level returns the level of a refusal for r: INFO unless set otherwise.
func (o *Observer) level(r interceptor.StopReason) slog.Level {
	if l, ok := o.levels[r]; ok {
		return l
	}
	return slog.LevelInfo
}

// Observe logs e if it is worth a line. It implements interceptor.Observer.
func (o *Observer) Observe(ctx context.Context, e interceptor.Event) {
	var (
		level slog.Level
		msg   string
		attrs [6]slog.Attr
		n     int
	)
	add := func(a slog.Attr) { attrs[n] = a; n++ }
	switch e.Kind {
	case interceptor.EventRetryRefused:
		level, msg = o.level(e.Reason), MsgRetryRefused
		if !o.l.Enabled(ctx, level) {
			return
		}
		add(slog.String("target", e.Target))
		add(slog.String("method", e.Method))
		add(slog.String("reason", reasonName(e.Reason)))
		add(slog.Int("attempt", e.Attempt))
		add(slog.Int("depth", e.Info.Depth))
		if e.Code != codes.OK {
			add(slog.String("code", e.Code.String()))
		}
	case interceptor.EventBreakerStateChange:
		level, msg = slog.LevelInfo, MsgBreakerChanged
		if e.To == breaker.Open {
			level = slog.LevelWarn
		}
		add(slog.String("target", e.Target))
		add(slog.String("from", e.From.String()))
		add(slog.String("to", e.To.String()))
	case interceptor.EventRetryScheduled:
		level, msg = slog.LevelDebug, MsgRetryScheduled
		if !o.l.Enabled(ctx, level) {
			return
		}
		add(slog.String("target", e.Target))
		add(slog.String("method", e.Method))
		add(slog.Int("attempt", e.Attempt))
		add(slog.Int("depth", e.Info.Depth))
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
	}
	return "other"
}
