package interceptor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Every tier of the chain hedges after 20 ms, and payment's first request
// hangs until its caller leaves: the edge's hedge answers the request,
// and payment sees 1 + MaxHedges calls, not one more per tier that
// hedges (2 x 2 x 2 = 8 with a naive hedge on every hop). The hang ends
// when the edge cancels the first attempt, down the whole chain.
func TestHedgeChainOneTierHedges(t *testing.T) {
	var first atomic.Bool
	cancelled := make(chan struct{})
	hangFirst := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if first.CompareAndSwap(false, true) {
			<-ctx.Done()
			close(cancelled)
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return h(ctx, req)
	}
	opts := func() []Option {
		return []Option{WithHedging(Hedging{Delay: 20 * time.Millisecond}), WithBudget(budget.Config{})}
	}
	c := testsvc.New(t, testsvc.Config{
		DialOptions: func(int) []grpc.DialOption { return mustNew(t, opts()...).DialOptions() },
		ServerOptions: func(tier int) []grpc.ServerOption {
			so := mustNew(t, opts()...).ServerOptions()
			if tier == 2 {
				so = append(so, grpc.ChainUnaryInterceptor(hangFirst))
			}
			return so
		},
	})
	resp, err := c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "slow"})
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	if resp.GetId() != "slow" {
		t.Errorf("reply %q, want the request's id", resp.GetId())
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("payment's hanging request was never cancelled")
	}
	if got := received(c); got[0] != 2 || got[1] != 2 || got[2] != 2 {
		t.Errorf("calls received by gateway, order, payment: %v, want 2 each", got)
	}
}
