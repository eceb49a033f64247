package interceptor_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/interceptor"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// dbDown is a payment service whose database is gone: it answers
// UNAVAILABLE to everything, on its own.
type dbDown struct {
	testsvcv1.UnimplementedTestServiceServer
}

func (dbDown) Unary(context.Context, *testsvcv1.UnaryRequest) (*testsvcv1.UnaryResponse, error) {
	return nil, status.Error(codes.Unavailable, "database unreachable")
}

// A payment service that fails everything on its own reports NOT_SERVING
// through its health server; a client with health checking stops sending
// to it: its channel leaves READY, and its calls fail at once, without
// reaching payment.
func ExampleWithHealth() {
	hs := health.NewServer()
	pay, err := interceptor.New(append(interceptor.Recommended(),
		interceptor.WithHealth(hs, admission.ServingConfig{Trial: time.Hour}))...)
	if err != nil {
		panic(err)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(pay.ServerOptions()...)
	testsvcv1.RegisterTestServiceServer(srv, dbDown{})
	healthpb.RegisterHealthServer(srv, hs) // for readiness; never for liveness
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	// Order's own throttle would stop calling payment too (and hold its
	// callers while payment is down); the example shows payment's side.
	order, err := interceptor.New()
	if err != nil {
		panic(err)
	}
	conn, err := grpc.NewClient("passthrough:///payment", append(order.DialOptions(),
		grpc.WithDefaultServiceConfig(interceptor.HealthServiceConfig),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := testsvcv1.NewTestServiceClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The database goes down: payment's own failures, 20 in a row over
	// 50 ms.
	for pay.Serving().Serving() && ctx.Err() == nil {
		_, _ = client.Unary(ctx, &testsvcv1.UnaryRequest{Id: "order-1"})
	}
	for s := conn.GetState(); s == connectivity.Ready && ctx.Err() == nil; s = conn.GetState() {
		conn.WaitForStateChange(ctx, s)
	}
	fmt.Println("payment serving:", pay.Serving().Serving())
	fmt.Println("order's channel:", conn.GetState())
	// Output:
	// payment serving: false
	// order's channel: TRANSIENT_FAILURE
}
