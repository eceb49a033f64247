package interceptor_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/interceptor"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// manualClock is a clock the example moves by hand, so that the
// throttle's "down" comes after the same failures on every run.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// ExampleWithoutHold calls an optional dependency that fails every call:
// once the adaptive throttle calls it down, a call that says WithoutHold
// is refused without reaching it and without waiting for the next
// probe's answer (a call without it would wait, up to
// adaptive.Config.Hold, 250 ms).
func ExampleWithoutHold() {
	pricing := &tier{} // fails every call with UNAVAILABLE
	lis, stop := serve(pricing, newService(), nil)
	defer stop()

	clk := &manualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	set, err := adaptive.NewSet(adaptive.Config{Clock: clk}, 0)
	if err != nil {
		panic(err)
	}
	sg, err := interceptor.New(interceptor.WithAdaptive(set), interceptor.WithMaxAttempts(1))
	if err != nil {
		panic(err)
	}
	conn := dial(lis, sg)
	defer conn.Close()
	client := testsvcv1.NewTestServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// Three failures over 60 ms from a cold start: down. The clock
	// stays at the third: the next probe may go 25-75 ms later (a random
	// gap), and the call below must not be it.
	for i := range 3 {
		if i > 0 {
			clk.advance(30 * time.Millisecond)
		}
		_, _ = client.Unary(ctx, &testsvcv1.UnaryRequest{Id: "quote"})
	}
	fmt.Println("calls at pricing:", pricing.calls)

	// Refused at once, as the throttle's: not held for the next probe's
	// answer (TestWithoutHold shows the hold skipped).
	_, err = client.Unary(ctx, &testsvcv1.UnaryRequest{Id: "quote"}, interceptor.WithoutHold())
	fmt.Println(status.Code(err), status.Convert(err).Message() == interceptor.ThrottledMessage)
	fmt.Println("calls at pricing:", pricing.calls)
	// Output:
	// calls at pricing: 3
	// Unavailable true
	// calls at pricing: 3
}
