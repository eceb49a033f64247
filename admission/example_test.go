package admission_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/admission"
)

func Example() {
	l, err := admission.New(admission.Config{InitialLimit: 2, MinLimit: 1})
	if err != nil {
		panic(err)
	}
	// A first attempt takes a slot; a retry may use half the limit only.
	first, err := l.Acquire(admission.ClassOf(0, 0), time.Time{})
	fmt.Println("first attempt:", err)
	_, err = l.Acquire(admission.ClassOf(1, 0), time.Time{})
	fmt.Println("retry:", errors.Is(err, admission.ErrLimit))
	first.Release(admission.Measured)
	fmt.Println("in flight:", l.InFlight())
	// Output:
	// first attempt: <nil>
	// retry: true
	// in flight: 0
}

func ExampleLimiter_Wait() {
	// A limit of 1 and a queue of 8 waiters, each waiting at most 1 ms.
	l, err := admission.New(admission.Config{InitialLimit: 1, MinLimit: 1, MaxLimit: 1,
		QueueSize: 8, QueueTimeout: time.Millisecond})
	if err != nil {
		panic(err)
	}
	held, _ := l.Acquire(admission.ClassFirst, time.Time{})
	// The limit is full: Wait waits for a slot, and gives up after 1 ms.
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
