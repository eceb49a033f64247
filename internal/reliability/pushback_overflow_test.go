package reliability

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/interceptor"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// TestPushbackOverflow is the regression test of a bug this suite found: a
// pushback of more than about 9.2e12 ms (at most 19 digits, so it passes the
// length check) overflowed time.Duration(pb)*time.Millisecond in
// interceptor/client.go (call.next) into a negative wait, which ended a
// unary call with success after a failed attempt and made a stream's
// RecvMsg spin on the failed attempt until the deadline. Now the wait is the
// backoff cap. (interceptor.TestPushbackHonoured checks the wait itself.)
func TestPushbackOverflow(t *testing.T) {
	const wait = 10 * time.Millisecond
	h := &hostile{}
	md := metadata.MD{interceptor.MetadataPushback: {"9223372036854775807"}}
	h.trailer.Store(&md)
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	testsvcv1.RegisterTestServiceServer(srv, h)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	i, err := interceptor.New(interceptor.WithBackoff(interceptor.Backoff{Base: wait, Cap: wait}))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///hostile", append(i.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	begin := time.Now()
	resp, err := testsvcv1.NewTestServiceClient(conn).Unary(ctx, &testsvcv1.UnaryRequest{})
	elapsed := time.Since(begin)
	if err == nil {
		t.Errorf("the server failed every attempt, the caller got success (%v) after %d attempt(s)", resp, h.attempts.Load())
	}
	if got := h.attempts.Load(); got != 3 {
		t.Errorf("attempts: got %d, want 3", got)
	}
	t.Logf("unary: %v after %v", err, elapsed)

	// The same trailer on a bidi stream: 3 attempts, then the failure.
	h.attempts.Store(0)
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	begin = time.Now()
	err = bidiOnce(sctx, testsvcv1.NewTestServiceClient(conn))
	t.Logf("bidi: %v after %v, %d attempt(s)", err, time.Since(begin), h.attempts.Load())
	if err == nil || sctx.Err() != nil {
		t.Errorf("bidi: got %v (context: %v), want the failure before the deadline", err, sctx.Err())
	}
	if got := h.attempts.Load(); got != 3 {
		t.Errorf("bidi attempts: got %d, want 3", got)
	}
}
