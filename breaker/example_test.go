package breaker_test

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// stepClock is a clock that moves only when told to, for the examples.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func Example() {
	b, err := breaker.New(breaker.Config{Name: "payments"})
	if err != nil {
		panic(err)
	}
	callPayments := func() error { return errors.New("unavailable") }

	for i := range 105 {
		p, err := b.Allow()
		if errors.Is(err, breaker.ErrOpen) {
			fmt.Printf("call %d: rejected, fail fast\n", i+1)
			break
		}
		if err := callPayments(); err != nil {
			p.Done(breaker.Failure)
			continue
		}
		p.Done(breaker.Success)
	}
	s := b.Snapshot()
	fmt.Println(s.State, s.Calls, s.Failures)
	// Output:
	// call 101: rejected, fail fast
	// open 100 100
}

func Example_recovery() {
	clk := &stepClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	b, err := breaker.New(breaker.Config{
		Name:   "payments",
		Clock:  clk,
		Jitter: breaker.NoJitter,
		OnStateChange: func(name string, from, to breaker.State) {
			fmt.Printf("%s: %v -> %v\n", name, from, to)
		},
	})
	if err != nil {
		panic(err)
	}
	for range 100 { // DefaultMinimumCalls failures open it
		p, _ := b.Allow()
		p.Done(breaker.Failure)
	}
	clk.Advance(time.Second)
	for range 3 { // the probes succeed
		p, err := b.Allow()
		if err != nil {
			panic(err)
		}
		p.Done(breaker.Success)
	}
	// Output:
	// payments: closed -> open
	// payments: open -> half-open
	// payments: half-open -> closed
}

func ExampleSet() {
	set, err := breaker.NewSet(breaker.Config{}, 100)
	if err != nil {
		panic(err)
	}
	for _, target := range []string{"payments:443", "orders:443", "payments:443"} {
		p, err := set.Get(target).Allow()
		if err != nil {
			continue
		}
		p.Done(breaker.Success)
	}
	snap := set.Snapshot()
	fmt.Println(set.Len(), snap["payments:443"].Calls, snap["orders:443"].Calls)
	// Output: 2 2 1
}
