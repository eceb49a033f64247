package adaptive

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Defaults used for zero Config fields.
const (
	DefaultK             = 3.0
	DefaultWindow        = time.Second
	DefaultDownAfter     = 50 * time.Millisecond
	DefaultProbeRatio    = 0.05
	DefaultProbeInterval = 50 * time.Millisecond
	DefaultHold          = 250 * time.Millisecond

	// MinWindow and MaxWindow bound Config.Window.
	MinWindow = 100 * time.Millisecond
	MaxWindow = time.Minute
)

// ErrInvalidConfig is wrapped by every error New and NewSet return for a
// bad Config; the message names the field.
var ErrInvalidConfig = errors.New("adaptive: invalid config")

// Config configures a Throttle. The zero value is a usable configuration
// with the defaults listed on each field.
type Config struct {
	// K is the accepts multiplier of the proportional rule: requests are
	// shed with probability max(0, (requests - K*accepts)/(requests+1)),
	// so the target receives about K times what it accepts. It must be at
	// least 1; values below 1/(1-f) shed at random failures of rate f.
	// Zero means DefaultK (3): silent up to 2/3 random failures. The SRE
	// book uses 2; 3 keeps a sick target's remaining capacity fully used
	// when its sheds come in bursts (see BENCHMARKS.md), at 0.6 calls per
	// request to a target at a fifth of its capacity instead of 0.4.
	K float64

	// Window is the length of the window that requests and accepts are
	// counted over, kept as ten buckets of Window/10. Shorter reacts
	// sooner, longer is smoother at low rates. Zero means DefaultWindow
	// (1 s). Valid: MinWindow (100 ms) to MaxWindow (1 min).
	Window time.Duration

	// DownAfter is the silence that makes a target down: an overload
	// failure that comes when the last accept is at least DownAfter old
	// marks the target down if the failures since that accept are
	// evidence enough (eight in a row behind a ready connection, one with
	// the connection seen not ready; see the package documentation), or,
	// if no accept ever came, at least three overload failures over
	// DownAfter. Zero means DefaultDownAfter (50 ms). Valid: positive up
	// to Window.
	DownAfter time.Duration

	// ProbeRatio is the share of requests, 1e-6 to 1, that may probe a
	// down target: every request adds ProbeRatio to a credit, and a probe
	// spends a whole one. Requests that became rare while the target was
	// down (a tier above holds them back) add what the requests of the
	// window before the down would have added since the last one, up to
	// a probe per Window. After a down on a run of failures behind a
	// ready connection (maybe a false alarm) the first probes need less:
	// one request's credit, then twice as much each time up to a whole
	// one. Zero means DefaultProbeRatio (0.05). Valid: 1e-6 to 1.
	ProbeRatio float64

	// ProbeInterval is the mean gap between probes of a down target at
	// high rates; each gap is drawn uniformly from [0.5, 1.5) x
	// ProbeInterval. Zero means DefaultProbeInterval (50 ms). Valid: up to
	// Window.
	ProbeInterval time.Duration

	// Hold is how long a caller refused because the target is down may
	// wait for it to come back (Throttle.Back) before it fails: the
	// interceptor holds a refused first attempt up to that long, within
	// the caller's deadline (ending an eighth of the time left before it,
	// at least 2 ms, so that the refusal reaches the callers above in
	// time), and sends it when the target answers meanwhile (at the
	// hold's end if it was revived without an answer: its connection
	// ready again, a "do not retry" answer); a probe that fails meanwhile
	// (an error, a broken connection, its per-attempt timeout; not one
	// unanswered at its caller's deadline, a Silence) ends the hold with
	// the refusal, whatever kind of request it was (the services on one
	// address share the target's throttle and its probes' news). So a held
	// caller learns what the next probe learns: a caller at a fixed
	// concurrency (a load test, a worker pool) waits for it instead of
	// spinning on refusals of microseconds, thousands a second per
	// caller, and once the target is back its request goes out on the
	// probe's answer instead of failing before it. Held callers that ask
	// again when the next probe may go keep a down target's probes at
	// about one per ProbeInterval (a review: 19.3-20.6 a second from 32
	// callers, 5.7-6.7 while every hold lasted 250 ms). The price: a
	// caller of a target that stays down gets its error when the next
	// probe fails (ProbeInterval apart at high rates: 25-75 ms), or after
	// Hold if no probe goes meanwhile (a quiet client's), not at once.
	// Zero means DefaultHold (250 ms, more than a health trial's 200 ms);
	// negative means no hold. Valid: up to Window.
	Hold time.Duration

	// OnDown, if not nil, is called with true when the target is marked
	// down and with false when it is back (an accept or Revive). A
	// revival by the connection alone, or by an answer to an attempt
	// allowed before the down (a straggler), is reported once an answer
	// confirms it (to an attempt sent since, for a straggler's), and a
	// down before that is not reported again (see Connectivity). It is
	// called with no lock held, on the goroutine that caused the change,
	// and must be quick. Calls for one Throttle may race when changes
	// come close together; each carries the state it reports.
	OnDown func(name string, down bool)

	// Name identifies the throttle in OnDown. Set overrides it with the
	// key.
	Name string

	// Clock is the time source. It must be safe for concurrent use. A
	// step back (a wall clock corrected, as time.Now().UTC() can be,
	// having dropped the monotonic reading) is not taken back: the time
	// after it adds from where the throttle was. It is called with no
	// lock held. Nil means the system clock.
	Clock interface{ Now() time.Time }

	// Rand returns a number in [0, 1) for the shedding draw and the probe
	// jitter; values outside are clamped. It must be safe for concurrent
	// use and is called with no lock held. Nil means math/rand/v2's
	// Float64.
	Rand func() float64
}

// normalize returns c with the defaults filled in, or an error naming the
// first invalid field.
func (c Config) normalize() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if c.K == 0 {
		c.K = DefaultK
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.DownAfter == 0 {
		c.DownAfter = DefaultDownAfter
	}
	if c.ProbeRatio == 0 {
		c.ProbeRatio = DefaultProbeRatio
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = DefaultProbeInterval
	}
	switch {
	case c.Hold == 0:
		c.Hold = DefaultHold
	case c.Hold < 0:
		c.Hold = 0
	}
	switch {
	case math.IsNaN(c.K) || math.IsInf(c.K, 0) || c.K < 1:
		return bad("K %v: want a finite number >= 1", c.K)
	case c.Window < MinWindow || c.Window > MaxWindow:
		return bad("Window %v: want %v to %v", c.Window, MinWindow, MaxWindow)
	case c.DownAfter < 0 || c.DownAfter > c.Window:
		return bad("DownAfter %v: want positive, up to Window (%v)", c.DownAfter, c.Window)
	case !(c.ProbeRatio >= 1e-6 && c.ProbeRatio <= 1):
		// Far below 1e-6, adding it to the credit changes nothing, and a
		// down target would never be probed.
		return bad("ProbeRatio %v: want 1e-6 to 1", c.ProbeRatio)
	case c.ProbeInterval < 0 || c.ProbeInterval > c.Window:
		return bad("ProbeInterval %v: want positive, up to Window (%v)", c.ProbeInterval, c.Window)
	case c.Hold > c.Window:
		return bad("Hold %v: want up to Window (%v), or negative for none", c.Hold, c.Window)
	}
	return c, nil
}
