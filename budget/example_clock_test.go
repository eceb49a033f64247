package budget_test

import (
	"fmt"
	"sync"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// fakeClock is a hand-made budget.Clock for tests: it moves only when told
// to. Every program can write one; the mutex makes it safe for the
// concurrent use a Budget may make of it.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// A test fakes time with its own Clock: here, a retry refused now is
// granted once the window has slid past the retries that used it up.
func ExampleClock() {
	clk := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	b, err := budget.New(budget.Config{MinRetriesPerSecond: 0.1, Window: 10 * time.Second, Clock: clk})
	if err != nil {
		panic(err)
	}
	// The floor: 0.1 retries a second over 10 s is one retry per window.
	fmt.Println("first retry:", b.TryRetry())
	fmt.Println("second retry:", b.TryRetry())
	clk.Advance(10 * time.Second)
	fmt.Println("after 10 s:", b.TryRetry())
	// Output:
	// first retry: true
	// second retry: false
	// after 10 s: true
}
