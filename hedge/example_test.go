package hedge_test

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/hedge"
)

// stepClock is a clock that moves only when told: Config.Clock takes
// any value with a Now method (nil: the system clock).
type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time          { return c.now }
func (c *stepClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

// A target that answers in 10 ms, and in 500 ms one time in fifty: the
// delay is Initial until 100 latencies came, then their 95th percentile,
// about 10 ms, so that the slow fiftieth of the requests gets a hedge
// after 11 ms instead of an answer after 500.
func Example() {
	clk := &stepClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	d, err := hedge.New(hedge.Config{Clock: clk})
	if err != nil {
		panic(err)
	}
	fmt.Println("no latency yet:", d.Get())
	for i := range 200 {
		lat := 10 * time.Millisecond
		if i%50 == 0 {
			lat = 500 * time.Millisecond
		}
		d.Record(lat)
	}
	clk.Advance(time.Second)
	fmt.Println("after 200:", d.Get().Round(100*time.Microsecond))
	// Output:
	// no latency yet: 50ms
	// after 200: 10.5ms
}
