package incidentsim

import (
	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/clock"
)

// Stacks returns the stacks compared: retries off, retries with no
// protection, today's recommended budget and breaker, and the adaptive
// throttle with the budget (the new recommendation).
func Stacks() []Stack {
	return []Stack{
		{Name: "off", Attempts: 1, New: func(*clock.Fake, func() float64) (Guard, error) { return Guard{}, nil }},
		{Name: "retries", Attempts: 3, New: func(*clock.Fake, func() float64) (Guard, error) { return Guard{}, nil }},
		{Name: "budget+breaker", Attempts: 3, New: func(clk *clock.Fake, rnd func() float64) (Guard, error) {
			b, err := budget.New(budget.Config{Clock: clk})
			if err != nil {
				return Guard{}, err
			}
			br, err := breaker.New(breaker.Config{Clock: clk, Rand: rnd})
			return Guard{Budget: b, Breaker: br}, err
		}},
		AdaptiveStack("adaptive+budget", adaptive.Config{}),
		AdaptiveStack("adaptive K=2", adaptive.Config{K: 2}),
	}
}

// AdaptiveStack is the adaptive throttle with cfg and the default budget,
// 3 attempts.
func AdaptiveStack(name string, cfg adaptive.Config) Stack {
	return Stack{Name: name, Attempts: 3, New: func(clk *clock.Fake, rnd func() float64) (Guard, error) {
		b, err := budget.New(budget.Config{Clock: clk})
		if err != nil {
			return Guard{}, err
		}
		c := cfg
		c.Clock, c.Rand = clk, rnd
		t, err := adaptive.New(c)
		return Guard{Budget: b, Throttle: t}, err
	}}
}
