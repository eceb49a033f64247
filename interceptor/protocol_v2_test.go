package interceptor

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/adaptive"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// TestProtocolV1TierInChain: a chain where a protocol-version-1 tier sits
// below version-2 tiers. Order answers as a v1 tier did after payment
// shed its call: UNAVAILABLE, "do not retry", and the shed mark passed
// up. Gateway (v2, Recommended) never retries it, slows down for it (its
// throttle sends a target that accepts nothing only a few requests) but
// never calls order down however many such answers come (busy is not
// broken), and answers the edge "do not retry" without the mark; the
// edge (v2) never calls gateway down either.
func TestProtocolV1TierInChain(t *testing.T) {
	order := &stubService{unary: func(_ int, ctx context.Context) error {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(MetadataPushback, "-1", MetadataShed, "1"))
		return status.Error(codes.Unavailable, "payment: admission: overloaded")
	}}
	orderSrv := grpc.NewServer()
	testsvcv1.RegisterTestServiceServer(orderSrv, order)
	orderLis := serveBufconn(t, orderSrv)

	gwI := mustNew(t, Recommended()...)
	toOrder := testsvcv1.NewTestServiceClient(dialBufconn(t, orderLis, "order", gwI.DialOptions()...))
	gateway := &stubService{unary: func(_ int, ctx context.Context) error {
		_, err := toOrder.Unary(ctx, &testsvcv1.UnaryRequest{Id: "x"})
		return status.Convert(err).Err()
	}}
	gwSrv := grpc.NewServer(gwI.ServerOptions()...)
	testsvcv1.RegisterTestServiceServer(gwSrv, gateway)
	gwLis := serveBufconn(t, gwSrv)

	edgeI := mustNew(t, Recommended()...)
	edge := testsvcv1.NewTestServiceClient(dialBufconn(t, gwLis, "gateway", edgeI.DialOptions()...))

	const requests = 200
	for i := range requests {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var tr metadata.MD
		_, err := edge.Unary(ctx, &testsvcv1.UnaryRequest{Id: "x"}, grpc.Trailer(&tr))
		cancel()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("request %d: got %v, want Unavailable", i, err)
		}
		if got := tr.Get(MetadataPushback); len(got) != 1 || got[0] != "-1" || len(tr.Get(MetadataShed)) != 0 {
			t.Fatalf("request %d: gateway's trailer %v, want pushback -1 without %s", i, tr, MetadataShed)
		}
	}
	if got := order.calls.Load(); got < 1 || got > requests {
		t.Errorf("calls at order: %d for %d requests, want at most one each (its -1 honoured)", got, requests)
	}
	for name, i := range map[string]*Interceptors{"gateway": gwI, "edge": edgeI} {
		i.RangeThrottles(func(target string, th *adaptive.Throttle) bool {
			if s := th.Stats(); s.Downs != 0 || s.Down {
				t.Errorf("%s's throttle for %s: %+v, want never down", name, target, s)
			}
			return true
		})
	}
}
