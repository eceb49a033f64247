package interceptor

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// downServer fails every unary call with UNAVAILABLE, counting them.
type downServer struct {
	testsvcv1.UnimplementedTestServiceServer
	calls atomic.Int64
}

func (d *downServer) Unary(context.Context, *testsvcv1.UnaryRequest) (*testsvcv1.UnaryResponse, error) {
	d.calls.Add(1)
	return nil, status.Error(codes.Unavailable, "down")
}

// kindCounter counts the events of one kind.
type kindCounter struct {
	kind EventKind
	mu   sync.Mutex
	n    int
}

func (l *kindCounter) Observe(_ context.Context, e Event) {
	if e.Kind == l.kind {
		l.mu.Lock()
		l.n++
		l.mu.Unlock()
	}
}

func (l *kindCounter) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// TestStackedRetryDetected: a client that installs the interceptor with
// grpc.WithChainUnaryInterceptor and a service config retry policy
// (maxAttempts 3) makes 3 x 3 = 9 calls; the server sees grpc-go's
// retries of stormguard's retries and reports each (4 of them), while the
// same client wired with DialOptions makes 3 calls and is not reported.
func TestStackedRetryDetected(t *testing.T) {
	const sc = `{"methodConfig":[{"name":[{"service":"stormguard.testsvc.v1.TestService"}],
		"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.001s","maxBackoff":"0.002s",
		"backoffMultiplier":1.0,"retryableStatusCodes":["UNAVAILABLE"]}}]}`
	for _, tt := range []struct {
		name         string
		dial         func(i *Interceptors) []grpc.DialOption
		calls, event int
	}{
		{"chain-style", func(i *Interceptors) []grpc.DialOption {
			return []grpc.DialOption{grpc.WithChainUnaryInterceptor(i.UnaryClient())}
		}, 9, 4},
		{"DialOptions", func(i *Interceptors) []grpc.DialOption { return i.DialOptions() }, 3, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			log := &kindCounter{kind: EventStackedRetry}
			d := &downServer{}
			lis := bufconn.Listen(1 << 16)
			srv := grpc.NewServer(mustNew(t, WithObserver(log)).ServerOptions()...)
			testsvcv1.RegisterTestServiceServer(srv, d)
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)
			opts := append(tt.dial(mustNew(t, noWait)),
				grpc.WithDefaultServiceConfig(sc),
				grpc.WithTransportCredentials(insecureCreds()),
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
			conn, err := grpc.NewClient("passthrough:///down", opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			_, err = testsvcv1.NewTestServiceClient(conn).Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("got %v, want Unavailable", err)
			}
			if got := d.calls.Load(); got != int64(tt.calls) {
				t.Errorf("calls at the server: got %d, want %d", got, tt.calls)
			}
			if got := log.count(); got != tt.event {
				t.Errorf("%v events: got %d, want %d", EventStackedRetry, got, tt.event)
			}
		})
	}
}
