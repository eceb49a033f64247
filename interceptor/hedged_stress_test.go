package interceptor

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/hedge"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Hedged calls from 4 goroutines at once, with real timers: attempts of
// random latency, codes, commits and deadlines (seeded), the caller's
// header and trailer options. Whatever the interleaving (run it with
// -race), every attempt that started is reported ended, and every call
// returns. (From the review of hedging, 2026-12-02.)
func TestHedgeStress(t *testing.T) {
	rec := &recorder{}
	i := mustNew(t, WithHedging(Hedging{Delay: 200 * time.Microsecond, MaxHedges: 3}), WithMaxAttempts(5), WithBudget(budget.Config{}), WithObserver(rec), noWait)
	cc := newCC(t)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			var mu sync.Mutex // r, for the attempts' goroutines
			draw := func(n int) int { mu.Lock(); defer mu.Unlock(); return r.IntN(n) }
			invoke := func(ctx context.Context, _ string, _, reply any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
				select {
				case <-time.After(time.Duration(draw(600)) * time.Microsecond):
				case <-ctx.Done():
					return ctx.Err()
				}
				for _, o := range opts {
					switch o := o.(type) {
					case grpc.HeaderCallOption:
						if draw(10) == 0 {
							*o.HeaderAddr = metadata.MD{} // a commit
						}
					case grpc.TrailerCallOption:
						*o.TrailerAddr = metadata.Pairs("a", "b")
					}
				}
				reply.(*testsvcv1.UnaryResponse).Id = "x"
				switch draw(6) {
				case 0:
					return errUnavailable
				case 1:
					return errInternal
				}
				return nil
			}
			for range 300 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(200+draw(2000))*time.Microsecond)
				var reply testsvcv1.UnaryResponse
				var hd, tr metadata.MD
				_ = i.UnaryClient()(ctx, "/svc/Get", &testsvcv1.UnaryRequest{}, &reply, cc, invoke, grpc.Header(&hd), grpc.Trailer(&tr))
				cancel()
			}
		})
	}
	wg.Wait()
	if s, e := rec.count(EventAttemptStart), rec.count(EventAttemptEnd); s != e || rec.count(EventHedgeSent) == 0 {
		t.Errorf("attempts started %d, ended %d, hedges sent %d: want as many ended, some hedges", s, e, rec.count(EventHedgeSent))
	}
}

// With real timers, a lead that answers before its hedge delay gives its
// timer back (leadTimer), and the calls after it take it again: every
// lead that does not answer must still get its hedge, from a timer that
// served other calls before, and no call a hedge of another's. Leads
// of every third call wait until cancelled; the others answer at once.
func TestHedgeLeadTimerReused(t *testing.T) {
	rec := &recorder{}
	// A third of the calls hedged: their share (1 - Percentile) allows it.
	i := mustNew(t, WithHedging(Hedging{Delay: time.Millisecond, Adaptive: hedge.Config{Percentile: 0.5}}), WithObserver(rec), noWait)
	cc := newCC(t)
	const calls = 300
	for n := range calls {
		slow := n%3 == 2
		invoke := func(ctx context.Context, _ string, _, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			md, _ := metadata.FromOutgoingContext(ctx)
			hedge := len(md.Get(MetadataAttempt)) > 0
			if slow && !hedge {
				<-ctx.Done() // the winning hedge cancels it
				return ctx.Err()
			}
			reply.(*testsvcv1.UnaryResponse).ServedBy = map[bool]string{false: "lead", true: "hedge"}[hedge]
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var reply testsvcv1.UnaryResponse
		err := i.UnaryClient()(ctx, "/svc/Get", &testsvcv1.UnaryRequest{}, &reply, cc, invoke)
		cancel()
		if err != nil || (slow && reply.ServedBy != "hedge") {
			t.Fatalf("call %d (slow lead %v): %q, %v; want an answer, a slow lead's from its hedge", n, slow, reply.ServedBy, err)
		}
	}
	if s, e := rec.count(EventAttemptStart), rec.count(EventAttemptEnd); s != e {
		t.Errorf("attempts started %d, ended %d", s, e)
	}
	if h := rec.count(EventHedgeSent); h < calls/3 {
		t.Errorf("hedges sent %d, want at least %d (one per slow lead)", h, calls/3)
	}
}
