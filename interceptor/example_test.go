package interceptor_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// tier is a toy service: it forwards to next, or, as the last tier, fails
// as a dead payment service would.
type tier struct {
	testsvcv1.UnimplementedTestServiceServer
	next  testsvcv1.TestServiceClient
	calls int
}

func (t *tier) Unary(ctx context.Context, req *testsvcv1.UnaryRequest) (*testsvcv1.UnaryResponse, error) {
	t.calls++
	if t.next == nil {
		return nil, status.Error(codes.Unavailable, "payment is down")
	}
	return t.next.Unary(ctx, req) // pass ctx on: that is all a handler does
}

// Example wires stormguard into gateway -> order -> payment with payment
// down: one user request reaches payment 3 times, not 27.
func Example() {
	payment := &tier{}
	paymentConn, stopPayment := serve(payment, nil)
	defer stopPayment()

	order := &tier{}
	orderConn, stopOrder := serve(order, dial(paymentConn))
	defer stopOrder()

	gateway := &tier{}
	gatewayConn, stopGateway := serve(gateway, dial(orderConn))
	defer stopGateway()

	// The edge client: stormguard too.
	userConn := dial(gatewayConn)
	defer userConn.Close()
	user := testsvcv1.NewTestServiceClient(userConn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := user.Unary(ctx, &testsvcv1.UnaryRequest{Id: "order-42"})

	fmt.Println("user got:", status.Code(err))
	fmt.Println("calls at gateway, order, payment:", gateway.calls, order.calls, payment.calls)
	// Output:
	// user got: Unavailable
	// calls at gateway, order, payment: 1 1 3
}

// newTier builds one tier's interceptors: its own budget and breakers.
func newTier() *interceptor.Interceptors {
	breakers, err := breaker.NewSet(breaker.Config{}, 0)
	if err != nil {
		panic(err)
	}
	i, err := interceptor.New(
		interceptor.WithBudget(budget.Config{}),
		interceptor.WithBreaker(breakers),
		interceptor.WithBackoff(interceptor.Backoff{Base: time.Millisecond}),
	)
	if err != nil {
		panic(err)
	}
	return i
}

// serve starts t on a bufconn listener with stormguard's server
// interceptor chained in with grpc.ChainUnaryInterceptor, and t's client to
// the next tier built with grpc.WithChainUnaryInterceptor.
func serve(t *tier, next *grpc.ClientConn) (*bufconn.Listener, func()) {
	if next != nil {
		t.next = testsvcv1.NewTestServiceClient(next)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(newTier().UnaryServer()))
	testsvcv1.RegisterTestServiceServer(srv, t)
	go func() { _ = srv.Serve(lis) }()
	return lis, func() {
		srv.Stop()
		if next != nil {
			_ = next.Close()
		}
	}
}

func dial(lis *bufconn.Listener) *grpc.ClientConn {
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableRetry(),
		grpc.WithChainUnaryInterceptor(newTier().UnaryClient()),
	)
	if err != nil {
		panic(err)
	}
	return conn
}

// ExampleWithMaxAttempts overrides the attempts for one call.
func ExampleWithMaxAttempts() {
	// At construction: every call gets up to 4 attempts.
	_, err := interceptor.New(interceptor.WithMaxAttempts(4))
	fmt.Println(err)
	// Per call, as a grpc.CallOption:
	//   client.Pay(ctx, req, interceptor.WithMaxAttempts(1))
	_, err = interceptor.New(interceptor.WithMaxAttempts(0))
	fmt.Println(err)
	// Output:
	// <nil>
	// stormguard: invalid option: WithMaxAttempts(0): want 1 to 100
}

// ExampleParseTierPolicyConfig reads "gateway 3, order 2, payment 1".
// Depths past the list get its smallest entry, never the configured
// attempts: a forged deep x-call-depth cannot buy retries.
func ExampleParseTierPolicyConfig() {
	cfg, err := interceptor.ParseTierPolicyConfig([]byte("attemptsByDepth: [3, 2, 1]\n"))
	if err != nil {
		panic(err)
	}
	policy, _ := cfg.Policy()
	for depth := range 4 {
		fmt.Printf("depth %d: %d attempts\n", depth, policy(interceptor.Info{Depth: depth}, 3))
	}
	fmt.Println("upstream retrying:", policy(interceptor.Info{UpstreamRetries: 1}, 3))
	// Output:
	// depth 0: 3 attempts
	// depth 1: 2 attempts
	// depth 2: 1 attempts
	// depth 3: 1 attempts
	// upstream retrying: 1
}
