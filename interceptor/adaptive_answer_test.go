package interceptor

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// One user over quota is not a target down. A user's trial: payment
// refused one abusive user's calls (half of order's) with
// RESOURCE_EXHAUSTED; order's throttle heard overloads, and whenever
// eight of them came in a row with no answer for 50 ms it called payment
// down for every user (12 downs in 36 s, 2-5 % of the other users' calls
// failed; with per-method keys 36-41 %). Here, after healthy calls, 20
// quota refusals 10 ms apart on the throttle's clock (200 ms, no answer
// between): the target stays up, nothing is refused, the breaker stays
// closed, and the next user's call is served.
func TestQuotaErrorsDoNotDownTarget(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set := newAdaptive(t, clk, nil)
	br := mustSet(t, breaker.Config{MinimumCalls: 5})
	svc := &stubService{unary: func(_ int, ctx context.Context) error {
		clk.Advance(10 * time.Millisecond)
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("user")) > 0 {
			return status.Error(codes.ResourceExhausted, "quota of user exceeded")
		}
		return nil
	}}
	cl := startStub(t, svc, WithAdaptive(set), WithBreaker(br))
	healthyCalls(t, cl, 20)
	th := set.Get("stub")
	for n := range 20 {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "user", "abuser"), 10*time.Second)
		_, err := cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: "x"})
		cancel()
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("abuser's call %d: %v, want the target's RESOURCE_EXHAUSTED (stats %+v)", n, err, th.Stats())
		}
	}
	if st := th.Stats(); st.Down || st.Downs != 0 || st.Refused != 0 || st.Shed != 0 {
		t.Fatalf("after 200 ms of quota refusals: stats %+v, want up, nothing refused", st)
	}
	if st := br.Get("stub").State(); st != breaker.Closed {
		t.Fatalf("breaker after quota refusals: %v, want closed", st)
	}
	if err := unaryWithin(cl, 10*time.Second); err != nil {
		t.Fatalf("another user's call: %v, want OK", err)
	}
}
