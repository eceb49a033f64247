// Package clock is the time source of budget and breaker: a one-method
// interface with a real and a fake implementation, so that windows and
// timers can be tested exactly.
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
