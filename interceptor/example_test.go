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
// down, as README's "Use it" does: one Interceptors per service, built
// from Recommended(), with its server options on the service's server
// and its dial options on every connection the service makes. One user
// request reaches payment 3 times, not 27: only order, the tier next to
// the failure, retries.
func Example() {
	payment := &tier{}
	paymentLis, stopPayment := serve(payment, newService(), nil)
	defer stopPayment()

	order := &tier{}
	orderLis, stopOrder := serve(order, newService(), paymentLis)
	defer stopOrder()

	gateway := &tier{}
	gatewayLis, stopGateway := serve(gateway, newService(), orderLis)
	defer stopGateway()

	// The edge client: a service of its own.
	userConn := dial(gatewayLis, newService())
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

// newService builds one service's interceptors: the recommended line,
// with a short backoff so that the example runs fast.
func newService() *interceptor.Interceptors {
	sg, err := interceptor.New(append(interceptor.Recommended(),
		interceptor.WithBackoff(interceptor.Backoff{Base: time.Millisecond}))...)
	if err != nil {
		panic(err)
	}
	return sg
}

// serve starts t on a bufconn listener with sg's server options, and
// its client of the next tier (at next, if any) with sg's dial options.
func serve(t *tier, sg *interceptor.Interceptors, next *bufconn.Listener) (*bufconn.Listener, func()) {
	var conn *grpc.ClientConn
	if next != nil {
		conn = dial(next, sg)
		t.next = testsvcv1.NewTestServiceClient(conn)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(sg.ServerOptions()...)
	testsvcv1.RegisterTestServiceServer(srv, t)
	go func() { _ = srv.Serve(lis) }()
	return lis, func() {
		srv.Stop()
		if conn != nil {
			_ = conn.Close()
		}
	}
}

func dial(lis *bufconn.Listener, sg *interceptor.Interceptors) *grpc.ClientConn {
	conn, err := grpc.NewClient("passthrough:///bufnet", append(sg.DialOptions(),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	)...)
	if err != nil {
		panic(err)
	}
	return conn
}

// ExampleWithMaxAttempts sets the attempts of every call at New, and of
// one call as a grpc.CallOption.
func ExampleWithMaxAttempts() {
	payment := &tier{} // fails every call with UNAVAILABLE
	lis, stop := serve(payment, newService(), nil)
	defer stop()
	sg, err := interceptor.New(interceptor.WithMaxAttempts(2),
		interceptor.WithBackoff(interceptor.Backoff{Base: time.Millisecond}))
	if err != nil {
		panic(err)
	}
	conn := dial(lis, sg)
	defer conn.Close()
	client := testsvcv1.NewTestServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	_, _ = client.Unary(ctx, &testsvcv1.UnaryRequest{Id: "a"})
	fmt.Println("calls at payment:", payment.calls)
	_, _ = client.Unary(ctx, &testsvcv1.UnaryRequest{Id: "b"}, interceptor.WithMaxAttempts(1)) // this call only
	fmt.Println("calls at payment:", payment.calls)

	_, err = interceptor.New(interceptor.WithMaxAttempts(0))
	fmt.Println(err)
	// Output:
	// calls at payment: 2
	// calls at payment: 3
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
