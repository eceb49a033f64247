package adaptive_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/adaptive"
)

// stepClock is a clock that moves only when told: Config.Clock takes
// any value with a Now method (nil: the system clock).
type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time          { return c.now }
func (c *stepClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

// A target that dies after healthy traffic (its connection broken) is
// down at its first failure 50 ms or more after its last accept; the
// calls then fail at once, and the first accepted probe brings it back.
// Behind a connection that stays ready it takes eight failures in a row.
func Example() {
	clk := &stepClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	t, err := adaptive.New(adaptive.Config{Clock: clk, Rand: func() float64 { return 0.5 }})
	if err != nil {
		panic(err)
	}
	call := func(o adaptive.Outcome) {
		p, err := t.Allow(false)
		if err != nil {
			fmt.Println("refused:", errors.Is(err, adaptive.ErrDown))
			return
		}
		p.Done(o)
		fmt.Println("sent, probe:", p.Probe())
	}
	call(adaptive.Accept)
	clk.Advance(time.Second)
	t.Connectivity(false)   // the connection broke: the process is gone
	call(adaptive.Overload) // a failure after a second without an accept: down
	call(adaptive.Accept)
	for range 19 { // probes are 5 % of requests, at least 50 ms apart
		if _, err := t.Allow(false); err == nil {
			fmt.Println("unexpected probe")
		}
	}
	clk.Advance(50 * time.Millisecond)
	call(adaptive.Accept) // the probe is answered: back
	fmt.Println("down:", t.Down())
	// Output:
	// sent, probe: false
	// sent, probe: false
	// refused: true
	// sent, probe: true
	// down: false
}
