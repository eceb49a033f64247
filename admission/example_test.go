package admission_test

import (
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
