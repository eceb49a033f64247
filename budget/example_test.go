package budget_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/budget"
)

func ExampleBudget() {
	clk := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	b, err := budget.New(budget.Config{Ratio: 0.2, NoFloor: true, Clock: clk})
	if err != nil {
		panic(err)
	}
	for range 10 {
		b.RecordRequest()
	}
	granted := 0
	for range 5 {
		if b.TryRetry() {
			granted++
		}
	}
	fmt.Println("retries granted for 10 requests:", granted)

	clk.Advance(10 * time.Second) // the window slides past them
	fmt.Println("retry after the window:", b.TryRetry())

	s := b.Snapshot()
	fmt.Printf("granted %d, refused %d\n", s.Granted, s.Refused)
	// Output:
	// retries granted for 10 requests: 2
	// retry after the window: false
	// granted 2, refused 4
}

func ExampleNew_invalid() {
	_, err := budget.New(budget.Config{Ratio: 1.5})
	fmt.Println(errors.Is(err, budget.ErrInvalidConfig))
	fmt.Println(err)
	// Output:
	// true
	// budget: invalid config: Ratio 1.5 out of range (0, 1] (0 means the default, 0.2)
}

func ExampleThrottle() {
	th, err := budget.NewThrottle(budget.ThrottleConfig{MaxTokens: 10, TokenRatio: 0.1})
	if err != nil {
		panic(err)
	}
	for i := 1; i <= 5; i++ {
		th.RecordOutcome(false)
		fmt.Printf("failure %d: %v tokens, retry %v\n", i, th.Snapshot().Tokens, th.TryRetry())
	}
	th.RecordOutcome(true)
	fmt.Printf("success: %v tokens, retry %v\n", th.Snapshot().Tokens, th.TryRetry())
	// Output:
	// failure 1: 9 tokens, retry true
	// failure 2: 8 tokens, retry true
	// failure 3: 7 tokens, retry true
	// failure 4: 6 tokens, retry true
	// failure 5: 5 tokens, retry false
	// success: 5.1 tokens, retry true
}

// call shows how a retry loop uses a Limiter: record the first attempt,
// report every outcome, and ask before each retry.
func call(l budget.Limiter, maxAttempts int, attempt func() error) error {
	l.RecordRequest()
	var err error
	for n := 1; ; n++ {
		err = attempt()
		l.RecordOutcome(err == nil)
		if err == nil || n == maxAttempts || !l.TryRetry() {
			return err
		}
	}
}

func ExampleLimiter() {
	clk := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	b, _ := budget.New(budget.Config{NoFloor: true, Clock: clk}) // 20 % of requests
	down := errors.New("unavailable")
	calls := 0
	for range 100 {
		_ = call(b, 3, func() error { calls++; return down })
	}
	fmt.Printf("100 requests to a dead target: %d calls (%.2fx)\n", calls, float64(calls)/100)
	// Output:
	// 100 requests to a dead target: 120 calls (1.20x)
}
