package interceptor

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// TestErrorMessageOverChain: through gateway -> order -> payment over
// bufconn, the user gets payment's own message, with no suffix per tier,
// and, once order's breaker for payment is open, a fixed message: never
// an internal target, even at an edge with WithUntrustedCallers. The Go
// error at order keeps stormguard's account.
func TestErrorMessageOverChain(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	var (
		mu       sync.Mutex
		orderErr error
	)
	c := testsvc.New(t, testsvc.Config{
		DialOptions: func(hop int) []grpc.DialOption {
			if hop == 0 {
				return nil // an outside client
			}
			opts := []Option{noWait}
			if hop == 2 {
				set, err := breaker.NewSet(breaker.Config{MinimumCalls: 3, Clock: fc}, 0)
				if err != nil {
					t.Fatal(err)
				}
				opts = append(opts, WithBreaker(set))
			}
			return mustNew(t, opts...).DialOptions()
		},
		ServerOptions: func(tier int) []grpc.ServerOption {
			var opts []Option
			if tier == 0 {
				opts = append(opts, WithUntrustedCallers())
			}
			i := mustNew(t, opts...)
			// Record the Go error that order's handler returns.
			rec := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				resp, err := h(ctx, req)
				if tier == 1 && err != nil {
					mu.Lock()
					orderErr = err
					mu.Unlock()
				}
				return resp, err
			}
			return []grpc.ServerOption{
				grpc.ChainUnaryInterceptor(i.UnaryServer(), rec),
				grpc.ChainStreamInterceptor(i.StreamServer()),
			}
		},
	})
	pay := c.Tier("payment")
	pay.SetDown(codes.Unavailable)
	var targets []string
	for hop := range c.Tiers() {
		targets = append(targets, c.Conn(hop).Target(), strings.TrimPrefix(c.Conn(hop).Target(), "passthrough:///"))
	}
	var msgs []string
	for n := range 3 {
		_, err := c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: fmt.Sprint(n)})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("request %d: got %v, want Unavailable", n, err)
		}
		msgs = append(msgs, status.Convert(err).Message())
	}
	want := fmt.Sprintf("injected: tier is down (%s)", codes.Unavailable)
	// Request 0: payment's own message. Request 1 and 2: the breaker
	// (3 failures at order's first request) refuses at order.
	if msgs[0] != want {
		t.Errorf("user's message: got %q, want payment's %q", msgs[0], want)
	}
	for _, m := range msgs[1:] {
		if m != BreakerOpenMessage {
			t.Errorf("user's message with order's breaker open: got %q, want %q", m, BreakerOpenMessage)
		}
	}
	for _, m := range msgs {
		for _, tg := range targets[2:] { // order's and payment's addresses
			if strings.Contains(m, tg) {
				t.Errorf("user's message %q names the internal target %q", m, tg)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if orderErr == nil || !strings.Contains(orderErr.Error(), "stormguard: ") || strings.Contains(orderErr.Error(), "payment") {
		t.Errorf("order's Go error %v: want stormguard's account, without the target", orderErr)
	}
}
