package interceptor

import (
	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/budget"
)

// Recommended returns the configuration stormguard recommends for every
// service of a chain, each part at its defaults:
//
//	sg, err := interceptor.New(interceptor.Recommended()...)
//
// It is the same as
//
//	set, err := adaptive.NewSet(adaptive.Config{}, 0)
//	sg, err := interceptor.New(
//		interceptor.WithAdaptive(set),                  // outages, partial loss, hangs, recovery
//		interceptor.WithBudget(budget.Config{}),        // random failures: retries <= 20 % (+10/s)
//		interceptor.WithAdmission(admission.Config{}), // server: real overload, a slow dependency's queue
//	)
//
// which is the form to write out to change a part; an option appended
// to Recommended() replaces its own (WithBudget, WithAdmission,
// WithAdaptive), but another retry limiter next to its budget is an
// error. The client's state is kept per target, whatever the method
// (see WithPerMethodKeys for what keying it per method costs).
//
// It is silent where protection must not fire: on a healthy service at
// capacity loaded by a fixed number of callers, however many, nothing is
// refused and no target is called down; random failures and one bad
// replica of several are retried away (a lone failure of a healthy target
// at once, under the budget); a target that answers "busy" is slowed down
// for, never called down; a method that fails everything (a watch whose
// backend is down) sheds the target's methods called ten times a window
// or more no more than their own outcomes say. It fires on a dead or
// hanging target, a partial loss, and real overload (arrivals faster
// than completions), where a server refuses only what it could not
// serve within its latency target or the caller's deadline.
//
// No circuit breaker: it refuses capacity that a sick target still has,
// and its open interval delays recovery; the adaptive throttle stops
// calling a dead target as soon, and recovers on the first answer. Each
// call returns new state: build the Interceptors once per process and
// share them.
func Recommended() []Option {
	set, err := adaptive.NewSet(adaptive.Config{}, 0)
	throttle := WithAdaptive(set)
	if err != nil { // the defaults are valid; this only guards a change of them
		throttle = Option{apply: func(*config) error { return invalid("Recommended: %v", err) }}
	}
	return []Option{
		throttle,
		WithBudget(budget.Config{}),
		WithAdmission(admission.Config{}),
	}
}
