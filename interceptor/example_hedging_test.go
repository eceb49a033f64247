package interceptor_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/interceptor"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// catalog answers at once, except its first request, which waits until
// its caller leaves (a slow disk, a garbage collection, a bad replica).
type catalog struct {
	testsvcv1.UnimplementedTestServiceServer
	calls     atomic.Int32
	cancelled chan struct{}
}

func (c *catalog) Unary(ctx context.Context, req *testsvcv1.UnaryRequest) (*testsvcv1.UnaryResponse, error) {
	if c.calls.Add(1) == 1 {
		<-ctx.Done()
		close(c.cancelled)
		return nil, ctx.Err()
	}
	return &testsvcv1.UnaryResponse{Id: req.GetId(), ServedBy: "hedge"}, nil
}

// ExampleWithHedging hedges an idempotent lookup: when no answer came
// after 20 ms, a second attempt goes out, and the first answer wins; the
// slow attempt is cancelled.
func ExampleWithHedging() {
	svc := &catalog{cancelled: make(chan struct{})}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(interceptor.ServerOptions(interceptor.Recommended()...)...)
	testsvcv1.RegisterTestServiceServer(srv, svc)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	// Hedge only the lookup (an idempotent method); a fixed delay here,
	// Delay 0 for the 95th percentile of the target's recent latencies.
	opts := append(interceptor.Recommended(), interceptor.WithHedging(interceptor.Hedging{
		Delay:   20 * time.Millisecond,
		Methods: []string{testsvcv1.TestService_Unary_FullMethodName},
	}))
	conn, err := grpc.NewClient("passthrough:///catalog",
		append(interceptor.DialOptions(opts...),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := testsvcv1.NewTestServiceClient(conn).Unary(ctx, &testsvcv1.UnaryRequest{Id: "book-7"})
	fmt.Println(resp.GetId(), resp.GetServedBy(), err)
	<-svc.cancelled
	fmt.Println("calls:", svc.calls.Load(), "- the slow one cancelled")
	// Output:
	// book-7 hedge <nil>
	// calls: 2 - the slow one cancelled
}
