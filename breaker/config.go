package breaker

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Defaults used for zero Config fields.
const (
	DefaultFailureThreshold = 0.5
	DefaultMinimumCalls     = 100
	DefaultWindow           = 10 * time.Second
	DefaultOpenInterval     = 1 * time.Second
	DefaultMaxOpenInterval  = 30 * time.Second
	DefaultJitter           = 0.2
	DefaultHalfOpenProbes   = 3
	DefaultMaxKeys          = 1024

	// MinWindow is the shortest Window New accepts.
	MinWindow = time.Second

	// The largest values New accepts: past them a breaker never opens,
	// or stays open for good, which no one means to configure.
	MaxWindow   = time.Hour // Window
	MaxInterval = time.Hour // OpenInterval, MaxOpenInterval
	MaxCalls    = 1 << 20   // MinimumCalls, ConsecutiveFailures
	MaxProbes   = 1000      // HalfOpenProbes

	// NoJitter, as Config.Jitter, turns jitter off: every open interval
	// is exactly the current interval.
	NoJitter = -1.0
)

// windowBuckets is the number of time buckets in the sliding window.
const windowBuckets = 10

// ErrInvalidConfig is wrapped by every error New and NewSet return for a
// bad Config; the message names the field.
var ErrInvalidConfig = errors.New("breaker: invalid config")

// Config configures a Breaker. The zero value is a usable configuration
// with the defaults listed on each field.
type Config struct {
	// Name identifies the breaker in OnStateChange and Snapshot. It may be
	// empty. Set overrides it with the key.
	Name string

	// FailureThreshold is the failure rate, in (0, 1], at which a closed
	// breaker opens: failures/calls in the window >= FailureThreshold.
	// Zero means DefaultFailureThreshold (0.5).
	FailureThreshold float64

	// MinimumCalls is the number of calls the window must hold before the
	// failure rate can open the breaker. Zero means DefaultMinimumCalls
	// (100). Valid: up to MaxCalls.
	//
	// The default is 100 because a rate over fewer calls is noise: with
	// 30 % of calls failing at random, 10 or more of 20 fail in about 5 %
	// of fresh windows, which would open a breaker at MinimumCalls 20,
	// while at 100 calls the threshold of 50 % is 4.4 standard deviations
	// above 30 %. The price: a breaker whose window never holds
	// MinimumCalls calls never opens on the rate, so a client making
	// fewer than MinimumCalls calls per Window (10 calls/s with the 10 s
	// default is the edge) is not protected unless ConsecutiveFailures is
	// set, and a target that is down opens the breaker only after 100
	// failed calls.
	MinimumCalls int

	// Window is the length of the sliding window, at least MinWindow
	// (1 s). It is kept as a ring of 10 buckets of Window/10 each, so the
	// rate covers the last 9 to 10 tenths of Window. Zero means
	// DefaultWindow (10 s). Valid: up to MaxWindow (1 h).
	Window time.Duration

	// ConsecutiveFailures, when positive, also opens a closed breaker
	// after that many failures in a row, whatever the rate and volume.
	// Zero turns this trigger off (the default). Valid: up to MaxCalls.
	ConsecutiveFailures int

	// OpenInterval is how long the breaker stays open after it first
	// opens. Each failed half-open probe doubles it, up to
	// MaxOpenInterval; it returns to OpenInterval when the breaker
	// closes. Zero means DefaultOpenInterval (1 s). Valid: up to
	// MaxInterval (1 h), as MaxOpenInterval.
	OpenInterval time.Duration

	// MaxOpenInterval caps the growth of the open interval; it must not
	// be shorter than OpenInterval. Zero means DefaultMaxOpenInterval
	// (30 s), or OpenInterval if that is longer (then it never grows).
	MaxOpenInterval time.Duration

	// Jitter spreads each open interval uniformly over
	// [d*(1-Jitter), d*(1+Jitter)), where d is the current interval after
	// the cap, so that many clients that tripped together do not probe
	// together. It must be in [0, 1) or NoJitter. Zero means
	// DefaultJitter (0.2, that is +-20 %); NoJitter means none.
	Jitter float64

	// HalfOpenProbes is both the number of calls a half-open breaker lets
	// through at the same time and the number of probe successes that
	// close it. Zero means DefaultHalfOpenProbes (3). Valid: up to
	// MaxProbes.
	HalfOpenProbes int

	// OnStateChange, if not nil, is called after each state change, never
	// with a lock held, so it may call any method of the breaker. Calls
	// for one breaker are serialized and come in the order of the
	// changes (each call's from is the previous call's to). A change is
	// reported by whichever goroutine is delivering at the time, so a call
	// to Allow or Done that causes a change may return before the
	// callback for it has run. The callback should be quick; while it
	// runs, further changes of the same breaker queue up. If it panics,
	// the panic reaches the caller of Allow or Done and the remaining
	// changes of that batch are not reported. Nil means no callback.
	OnStateChange func(name string, from, to State)

	// Clock is the time source. It must be safe for concurrent use. Nil
	// means the system clock.
	Clock interface{ Now() time.Time }

	// Rand returns a number in [0, 1) for the jitter; values outside are
	// clamped. It must be safe for concurrent use and is never called with
	// a lock held. Nil means math/rand/v2's Float64.
	Rand func() float64
}

// normalize returns c with defaults filled in, or an error naming the
// first invalid field.
func (c Config) normalize() (Config, error) {
	bad := func(field string, v any, why string) (Config, error) {
		return Config{}, fmt.Errorf("%w: %s %v %s", ErrInvalidConfig, field, v, why)
	}
	switch {
	case math.IsNaN(c.FailureThreshold) || c.FailureThreshold < 0 || c.FailureThreshold > 1:
		return bad("FailureThreshold", c.FailureThreshold, "is not in (0, 1]")
	case c.FailureThreshold == 0:
		c.FailureThreshold = DefaultFailureThreshold
	}
	switch {
	case c.MinimumCalls < 0:
		return bad("MinimumCalls", c.MinimumCalls, "is negative")
	case c.MinimumCalls == 0:
		c.MinimumCalls = DefaultMinimumCalls
	case c.MinimumCalls > MaxCalls:
		return bad("MinimumCalls", c.MinimumCalls, fmt.Sprintf("is more than %d", MaxCalls))
	}
	switch {
	case c.Window < 0:
		return bad("Window", c.Window, "is negative")
	case c.Window == 0:
		c.Window = DefaultWindow
	case c.Window < MinWindow:
		return bad("Window", c.Window, "is shorter than "+MinWindow.String())
	case c.Window > MaxWindow:
		return bad("Window", c.Window, "is longer than "+MaxWindow.String())
	}
	switch {
	case c.ConsecutiveFailures < 0:
		return bad("ConsecutiveFailures", c.ConsecutiveFailures, "is negative")
	case c.ConsecutiveFailures > MaxCalls:
		return bad("ConsecutiveFailures", c.ConsecutiveFailures, fmt.Sprintf("is more than %d", MaxCalls))
	}
	switch {
	case c.OpenInterval < 0:
		return bad("OpenInterval", c.OpenInterval, "is negative")
	case c.OpenInterval == 0:
		c.OpenInterval = DefaultOpenInterval
	case c.OpenInterval > MaxInterval:
		return bad("OpenInterval", c.OpenInterval, "is longer than "+MaxInterval.String())
	}
	switch {
	case c.MaxOpenInterval < 0:
		return bad("MaxOpenInterval", c.MaxOpenInterval, "is negative")
	case c.MaxOpenInterval > MaxInterval:
		return bad("MaxOpenInterval", c.MaxOpenInterval, "is longer than "+MaxInterval.String())
	case c.MaxOpenInterval == 0:
		c.MaxOpenInterval = max(DefaultMaxOpenInterval, c.OpenInterval)
	case c.MaxOpenInterval < c.OpenInterval:
		return bad("MaxOpenInterval", c.MaxOpenInterval, "is shorter than OpenInterval "+c.OpenInterval.String())
	}
	switch {
	case c.Jitter == NoJitter:
	case math.IsNaN(c.Jitter) || c.Jitter < 0 || c.Jitter >= 1:
		return bad("Jitter", c.Jitter, "is not in [0, 1) nor NoJitter")
	case c.Jitter == 0:
		c.Jitter = DefaultJitter
	}
	switch {
	case c.HalfOpenProbes < 0:
		return bad("HalfOpenProbes", c.HalfOpenProbes, "is negative")
	case c.HalfOpenProbes == 0:
		c.HalfOpenProbes = DefaultHalfOpenProbes
	case c.HalfOpenProbes > MaxProbes:
		return bad("HalfOpenProbes", c.HalfOpenProbes, fmt.Sprintf("is more than %d", MaxProbes))
	}
	return c, nil
}
