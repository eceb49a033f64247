package admission_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/admission"
)

func Example() {
	l, err := admission.New(admission.Config{}) // a 20 ms queueing target under overload
	if err != nil {
		panic(err)
	}
	// A server that keeps up with its arrivals is never overloaded: every
	// request is admitted, however many are in flight.
	var permits []admission.Permit
	for range 1000 {
		p, err := l.Acquire(admission.ClassOf(0, 0), time.Time{})
		if err != nil {
			fmt.Println("refused:", err)
			return
		}
		permits = append(permits, p)
	}
	fmt.Println("in flight:", l.InFlight(), "overloaded:", l.Overloaded())
	for _, p := range permits {
		p.Release(admission.Measured)
		// Before the answer goes out: returns at once unless the limiter
		// holds its answers to tell a load test's ramp from an overload.
		l.HoldAnswer(context.Background())
	}
	fmt.Println("in flight:", l.InFlight())
	// Output:
	// in flight: 1000 overloaded: false
	// in flight: 0
}

func ExampleLimiter_Wait() {
	// A fixed cap of 1 request in flight and a queue of 8 waiters, each
	// waiting at most 1 ms.
	l, err := admission.New(admission.Config{MaxInFlight: 1, QueueSize: 8, QueueTimeout: time.Millisecond})
	if err != nil {
		panic(err)
	}
	held, _ := l.Acquire(admission.ClassFirst, time.Time{})
	// The cap is reached: Wait waits for a slot, and gives up after 1 ms.
	_, err = l.Wait(context.Background(), admission.ClassFirst, time.Time{})
	fmt.Println("timed out:", errors.Is(err, admission.ErrQueueTimeout))
	held.Release(admission.Measured)
	p, err := l.Wait(context.Background(), admission.ClassFirst, time.Time{})
	fmt.Println("after the release:", err)
	p.Release(admission.Measured)
	// Output:
	// timed out: true
	// after the release: <nil>
}
