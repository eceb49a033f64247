// Package clock is the time source of the mechanism packages: a
// one-method interface with a real and a fake implementation, so that
// windows and timers can be tested exactly, and Since, a measure of
// time that never goes back.
package clock

import (
	"sync"
	"time"
)

// Clock tells the time. Implementations must be safe for concurrent use.
type Clock interface {
	Now() time.Time
}

// Real is the system clock. Its readings carry Go's monotonic component, so
// durations computed from them are immune to wall-clock jumps.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// Fake is a clock that moves only when told to. The zero value starts at
// the zero time; use NewFake for a readable start.
type Fake struct {
	mu  sync.Mutex
	now time.Time
}

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves the clock by d. A negative d moves it backwards, which
// tests use to check that callers survive a clock that goes back.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

// Set moves the clock to t.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	f.now = t
	f.mu.Unlock()
}

// Since measures the time since it was made on a Clock, never going
// back. On the system clock the monotonic reading sees to that, and it
// takes no lock. On any other Clock, a reading earlier than the one
// before (a wall clock corrected, as time.Now().UTC() can be, having no
// monotonic reading) adds nothing, and the readings after it add from
// there: windows and probe times measured on it go on instead of
// standing still until the clock has caught up.
type Since struct {
	clk   Clock
	start time.Time
	sys   bool

	mu   sync.Mutex
	last time.Duration // the reading before, from start
	el   time.Duration // the time measured
}

// NewSince starts measuring on c (nil: the system clock).
func NewSince(c Clock) *Since {
	if c == nil {
		c = Real{}
	}
	_, sys := c.(Real)
	return &Since{clk: c, start: c.Now(), sys: sys}
}

// Start returns the reading the measure started from.
func (s *Since) Start() time.Time { return s.start }

// Elapsed returns the time since the start, never less than before.
func (s *Since) Elapsed() time.Duration {
	if s.sys {
		return max(time.Since(s.start), 0)
	}
	raw := s.clk.Now().Sub(s.start)
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := raw - s.last; d > 0 {
		s.el += d
	}
	s.last = raw
	return s.el
}
