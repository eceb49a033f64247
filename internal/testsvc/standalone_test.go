package testsvc

import (
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// standalone is one tier served over TCP on 127.0.0.1, as a process of
// stormsim serves it, with the stand-in that counts what it sends on.
type standalone struct {
	tier *Tier
	next *Tier // stand-in for the next tier; nil for the last
	srv  *grpc.Server
	addr string
}

func serveStandalone(t *testing.T, name, nextAddr, nextName string) *standalone {
	t.Helper()
	s := &standalone{}
	var next testsvcv1.TestServiceClient
	if nextAddr != "" {
		s.next = NewTier(nextName, nil, 0)
		conn, err := grpc.NewClient("passthrough:///"+nextAddr,
			append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, s.next.CountingDialOptions()...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		next = testsvcv1.NewTestServiceClient(conn)
	}
	s.tier = NewTier(name, next, 1)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = lis.Addr().String()
	s.srv = grpc.NewServer(s.tier.AdmissionOptions()...)
	s.tier.Register(s.srv, s.next)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.srv.Serve(lis) }()
	t.Cleanup(func() { s.srv.Stop(); <-done })
	return s
}

func dialTCP(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func TestStandaloneChain(t *testing.T) {
	pay := serveStandalone(t, "payment", "", "")
	order := serveStandalone(t, "order", pay.addr, "payment")
	gw := serveStandalone(t, "gateway", order.addr, "order")
	ctx := ctxT(t, 10*time.Second)
	cl := testsvcv1.NewTestServiceClient(dialTCP(t, gw.addr))

	resp, err := cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: "a"})
	if err != nil || resp.GetServedBy() != "payment" {
		t.Fatalf("healthy: got %v, %v; want an answer from payment", resp, err)
	}
	for _, s := range []*standalone{gw, order, pay} {
		if got := s.tier.Received(Unary); got != 1 {
			t.Errorf("%s received %d calls, want 1", s.tier.Name(), got)
		}
	}

	pay.tier.SetDown(codes.Unavailable)
	_, err = cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: "b"})
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("payment down: got %v, want Unavailable", err)
	}
	if got := pay.tier.Failed(); got != 1 {
		t.Fatalf("payment failed %d calls, want 1", got)
	}

	// The last tier has no next tier and reports nothing sent.
	var header metadata.MD
	if _, err := testsvcv1.NewStatsServiceClient(dialTCP(t, pay.addr)).GetStats(ctx, &testsvcv1.GetStatsRequest{}, grpc.Header(&header)); err != nil {
		t.Fatalf("payment GetStats: %v", err)
	}
	if n, ok := SentFromHeader(header, Unary); ok {
		t.Fatalf("payment reported %d attempts sent, want none", n)
	}

	// A stopped payment receives nothing; order still counts what it sent.
	pay.srv.Stop()
	_, err = cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: "c"})
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("payment stopped: got %v, want Unavailable", err)
	}
	if got := pay.tier.Received(Unary); got != 2 {
		t.Fatalf("stopped payment: received %d calls in all, want 2", got)
	}
	if got := order.next.Attempts(Unary); got != 3 {
		t.Fatalf("order sent %d attempts to payment, want 3", got)
	}

	stats := testsvcv1.NewStatsServiceClient(dialTCP(t, order.addr))
	header = nil
	st, err := stats.GetStats(ctx, &testsvcv1.GetStatsRequest{}, grpc.Header(&header))
	if err != nil {
		t.Fatalf("GetStats: %v", err)
	}
	if st.GetTier() != "order" || st.GetReceived()["unary"] != 3 || st.GetFailed() != 2 {
		t.Fatalf("order's stats: got %v, want order with 3 unary calls, 2 failed", st)
	}
	if n, ok := SentFromHeader(header, Unary); !ok || n != 3 {
		t.Fatalf("order's sent attempts in the header: got %d, %v; want 3, true", n, ok)
	}

	// The gateway counts what it sent to order.
	header = nil
	if _, err := testsvcv1.NewStatsServiceClient(dialTCP(t, gw.addr)).GetStats(ctx, &testsvcv1.GetStatsRequest{}, grpc.Header(&header)); err != nil {
		t.Fatalf("gateway GetStats: %v", err)
	}
	if n, ok := SentFromHeader(header, Unary); !ok || n != 3 {
		t.Fatalf("gateway's sent attempts: got %d, %v; want 3, true", n, ok)
	}
}

func TestSentFromHeader(t *testing.T) {
	tests := []struct {
		md     metadata.MD
		want   int64
		wantOK bool
	}{
		{metadata.Pairs(MetadataSentPrefix+"unary", "7"), 7, true},
		{metadata.MD{}, 0, false},
		{metadata.Pairs(MetadataSentPrefix+"unary", "x"), 0, false},
		{metadata.Pairs(MetadataSentPrefix+"unary", "-1"), 0, false},
		{metadata.Pairs(MetadataSentPrefix+"unary", "1", MetadataSentPrefix+"unary", "2"), 0, false},
	}
	for _, tt := range tests {
		got, ok := SentFromHeader(tt.md, Unary)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("SentFromHeader(%v): got %d, %v; want %d, %v", tt.md, got, ok, tt.want, tt.wantOK)
		}
	}
}
