package interceptor

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/clock"
)

// The recommended client (adaptive throttle and budget) at 1, 10 and 50
// calls/s to a target that fails 10 % or 30 % at random behind a ready
// channel serves at least what retries off serves, and at 30 % at least
// 83 %, and its throttle refuses (almost) nothing. Review finding 1: at
// 10 calls/s users got 31.6 % at 10 % failures and 10.8 % at 30 %, the
// throttle marking the target down at each failure.
func TestAdaptiveQuietClientUserSuccess(t *testing.T) {
	for _, rate := range []float64{1, 10, 50} {
		for _, fail := range []float64{0.1, 0.3} {
			clk := clock.NewFake(time.Unix(0, 0))
			set, err := adaptive.NewSet(adaptive.Config{Clock: clk, Rand: rand.New(rand.NewPCG(5, 6)).Float64}, 0)
			if err != nil {
				t.Fatal(err)
			}
			i := mustNew(t, WithAdaptive(set), WithBudget(budget.Config{Clock: clk}), noWait)
			r := rand.New(rand.NewPCG(3, 4))
			inv := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
				if r.Float64() < fail {
					return errUnavailable
				}
				return nil
			}
			cc := newCC(t)
			ok, n := 0, 2000
			for range n {
				clk.Advance(time.Duration(float64(time.Second) / rate))
				if i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, inv) == nil {
					ok++
				}
			}
			success := float64(ok) / float64(n)
			s := set.Get(normalizeTarget(cc.Target())).Stats()
			t.Logf("%2.0f calls/s, %2.0f %% random failures: success %.1f %%, %+v", rate, 100*fail, 100*success, s)
			want := 1 - fail
			if fail == 0.3 {
				want = 0.83
			}
			if success < want {
				t.Errorf("%.0f calls/s, %.0f %% random failures: success %.4f, want >= %.2f", rate, 100*fail, success, want)
			}
			if refused := s.Shed + s.Refused; refused > int64(n)/1000 {
				t.Errorf("%.0f calls/s, %.0f %% random failures: %d first attempts refused, want at most 0.1 %%", rate, 100*fail, refused)
			}
		}
	}
}
