package interceptor

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// A payment that holds every call until the caller's deadline engages the
// adaptive throttle exactly as one that answers UNAVAILABLE does (issue
// 13, target 5), over a real gRPC connection (bufconn): after healthy
// traffic, the first call that hangs to its deadline marks payment down,
// and from then on only probes reach it, one per 20 requests (ProbeRatio
// 5 %), 0.05 calls at payment per request. The throttle runs on a fake
// clock advanced 10 ms per request (100 req/s), so the counts are exact;
// the hangs themselves end at each call's real 50 ms deadline.
func TestAdaptiveHangOverGRPC(t *testing.T) {
	for _, tc := range []struct {
		name      string
		hang      bool
		firstCode codes.Code // of the call that meets the sick payment first
	}{
		{name: "hang", hang: true, firstCode: codes.DeadlineExceeded},
		{name: "unavailable", firstCode: codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			set := newAdaptive(t, clk, nil)
			var sick atomic.Bool
			svc := &stubService{unary: func(_ int, ctx context.Context) error {
				switch {
				case !sick.Load():
					return nil
				case tc.hang:
					<-ctx.Done() // hold the call until the caller gives up
					return status.FromContextError(ctx.Err()).Err()
				}
				return errStubDown
			}}
			cl := startStub(t, svc, WithAdaptive(set))
			// A hang ends at the call's deadline; an UNAVAILABLE call
			// gets a long one, which a starved machine cannot outlast
			// (at 50 ms it could, and read DEADLINE_EXCEEDED).
			deadline := 10 * time.Second
			if tc.hang {
				deadline = 50 * time.Millisecond
			}
			call := func() error { return unaryWithin(cl, deadline) }
			healthyCalls(t, cl, 20)
			th := set.Get("stub")
			clk.Advance(time.Second)
			sick.Store(true)

			// The calls at the sick payment, 10 ms apart: down at the
			// eighth overload failure in a row behind a ready connection
			// (its last accept is a second old), whether payment hangs or
			// says UNAVAILABLE (hangs count once they have gone on for
			// DownAfter, 50 ms, and then all of them).
			calls := 0
			for ; calls < 8 && !th.Down(); calls++ {
				clk.Advance(10 * time.Millisecond)
				if err := call(); status.Code(err) != tc.firstCode {
					t.Fatalf("sick call %d: %v, want %v", calls, err, tc.firstCode)
				}
			}
			if !th.Down() {
				t.Fatalf("payment not down after %d calls that met a %s", calls, tc.name)
			}
			if st := th.Stats(); st.Downs != 1 || st.Probes != 0 {
				t.Fatalf("after the sick calls: %+v, want one down, no probe", st)
			}

			const requests = 200
			got := map[codes.Code]int{}
			for range requests {
				clk.Advance(10 * time.Millisecond)
				got[status.Code(call())]++
			}
			st := th.Stats()
			if st.Probes < 1 {
				t.Errorf("no probe in %d requests", requests)
			}
			if per := float64(st.Probes) / requests; per > 0.10 {
				t.Errorf("calls at payment per request after the first deadline: %.3f, want <= 0.10", per)
			}
			// Every other request was refused at once, without reaching
			// payment: UNAVAILABLE (the don't-retry mark); each probe met
			// payment's hang or its UNAVAILABLE.
			want := map[codes.Code]int{codes.Unavailable: requests - int(st.Probes)}
			want[tc.firstCode] += int(st.Probes)
			if got[codes.Unavailable] != want[codes.Unavailable] || got[tc.firstCode] != want[tc.firstCode] || len(got) != len(want) {
				t.Errorf("codes: %v, want %v", got, want)
			}
			if !th.Down() || st.Refused != requests-st.Probes {
				t.Errorf("down %v, refused %d: want still down, %d refused", th.Down(), st.Refused, requests-st.Probes)
			}
		})
	}
}

// passedDeadline is a context whose deadline has passed while its timer
// has not fired yet: Err is still nil, as in the moment grpc-go reports
// the server's RST_STREAM after the deadline.
type passedDeadline struct{ context.Context }

func (passedDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// The regression behind TestAdaptiveHangOverGRPC, without its race: the
// attempt ends with DEADLINE_EXCEEDED after the caller's deadline has
// passed, but before the caller's context says so. That is a hang:
// payment goes down, as it does when the caller's own timer fires first,
// and the call is not retried. Before the fix it counted as an accept. A
// DEADLINE_EXCEEDED well before the caller's deadline (a tier below whose
// own timeout expired) stays an answer.
func TestAdaptiveDeadlineAnswerIsAHang(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ctx      func(t *testing.T) context.Context
		wantDown bool
	}{
		{"deadline passed", func(*testing.T) context.Context { return passedDeadline{context.Background()} }, true},
		{"deadline ahead", func(t *testing.T) context.Context { return ctxTimeout(t, time.Minute) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			set := newAdaptive(t, clk, nil)
			var s sleeps
			i := mustNew(t, WithAdaptive(set), s.option())
			cc := newCC(t)
			if err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, (&fakeInvoker{results: []error{nil}}).invoke); err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Second)
			// Eight such answers in a row, 10 ms apart: the run that
			// marks a target behind a ready channel down, if they are
			// hangs.
			for range 8 {
				clk.Advance(10 * time.Millisecond)
				f := &fakeInvoker{results: []error{status.Error(codes.DeadlineExceeded, "stream terminated by RST_STREAM with error code: CANCEL")}}
				err := i.UnaryClient()(tc.ctx(t), "/svc/M", nil, nil, cc, f.invoke)
				if status.Code(err) != codes.DeadlineExceeded || len(f.seen) != 1 {
					t.Fatalf("got %v after %d attempts, want DeadlineExceeded after 1", err, len(f.seen))
				}
			}
			if got := set.Get("payment").Down(); got != tc.wantDown {
				t.Fatalf("down: got %v, want %v", got, tc.wantDown)
			}
		})
	}
}

// A target marked down by a hang (every tier of a chain sees the hang of
// the one at its end at the same deadline) and whose probe is answered
// "do not retry" is alive: the answer revives it, so that traffic reaches
// the tier below and its own probes. Before, it stayed down, and a chain
// came back from a hang only when the probes of every tier lined up.
func TestAdaptiveDontRetryProbeRevives(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set := newAdaptive(t, clk, nil)
	var s sleeps
	i := mustNew(t, WithAdaptive(set), s.option())
	cc := newCC(t)
	if err := i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, (&fakeInvoker{results: []error{nil}}).invoke); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	for range 8 { // the run of hangs that marks it down, 10 ms apart
		clk.Advance(10 * time.Millisecond)
		_ = i.UnaryClient()(passedDeadline{context.Background()}, "/svc/M", nil, nil, cc,
			(&fakeInvoker{results: []error{status.Error(codes.DeadlineExceeded, "hung")}}).invoke)
	}
	th := set.Get("payment")
	if !th.Down() {
		t.Fatal("not down after the hangs")
	}
	// Refused calls until one probes; it is answered "do not retry".
	f := &fakeInvoker{results: []error{errUnavailable}, pushbacks: []string{"-1"}}
	for n := 0; n < 100 && th.Stats().Probes == 0; n++ {
		clk.Advance(10 * time.Millisecond)
		_ = i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, cc, f.invoke)
	}
	if len(f.seen) != 1 || th.Stats().Probes != 1 {
		t.Fatalf("%d attempts reached the target, %d probes; want the one probe", len(f.seen), th.Stats().Probes)
	}
	if th.Down() {
		t.Fatal("a probe answered \"do not retry\" left the target down")
	}
}

// A caller whose deadlines are shorter than the target takes to answer
// says nothing about the target: over a real gRPC connection, 40 calls
// whose deadlines run out 3 ms (on the throttle's clock) after they are
// sent, one after another, at a target whose calls were answered after
// 10 ms, leave it up for every other caller (a user's trial: a client
// with 3 ms deadlines made a tier refuse 7 of 8 calls of its quiet
// callers). The same calls waiting 25 ms, over twice what the answers
// took, are a hang, as before.
func TestShortDeadlinesDoNotDownTarget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		waited   time.Duration
		wantDown bool
	}{
		{"shorter than the answers", 3 * time.Millisecond, false},
		{"over twice the answers", 25 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			set := newAdaptive(t, clk, nil)
			var short atomic.Bool
			svc := &stubService{unary: func(_ int, ctx context.Context) error {
				if short.Load() {
					clk.Advance(tc.waited)
					<-ctx.Done() // no answer before the caller's deadline
					return status.FromContextError(ctx.Err()).Err()
				}
				clk.Advance(10 * time.Millisecond) // answered after 10 ms
				return nil
			}}
			cl := startStub(t, svc, WithAdaptive(set))
			call := func(d time.Duration) error { return unaryWithin(cl, d) }
			healthyCalls(t, cl, 20)
			short.Store(true)
			th := set.Get("stub")
			// 40 calls: 120 ms of them on the throttle's clock, more than
			// DownAfter. Their real deadline leaves the handler time to
			// advance the clock before the caller gives up.
			for n := 0; n < 40 && !th.Down(); n++ {
				if err := call(20 * time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
					t.Fatalf("short call %d: %v, want DEADLINE_EXCEEDED", n, err)
				}
			}
			st := th.Stats()
			if st.Down != tc.wantDown {
				t.Fatalf("after calls whose deadlines ran out %v after they were sent: stats %+v, want down %v", tc.waited, st, tc.wantDown)
			}
			if tc.wantDown {
				return
			}
			short.Store(false)
			if err := call(10 * time.Second); err != nil || th.Stats().Refused != 0 {
				t.Fatalf("a caller with a long deadline: %v (stats %+v), want OK, nothing refused", err, th.Stats())
			}
		})
	}
}

// A stream whose caller's deadline runs out before the target sent
// anything says nothing about the target: a watch on a healthy server
// that has nothing to send sends nothing, not even its header. A user's
// trial: 20 watches with 1 s deadlines, reopened as each ended and no
// other traffic, had 185 of 227 opens refused after the target was called
// down. Here, 12 such streams of each kind, each taking 30 ms on the
// throttle's clock, after healthy unary calls, leave the target up.
func TestQuietStreamsDoNotDownTarget(t *testing.T) {
	for _, k := range kindCalls[1:] {
		t.Run(k.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			set := newAdaptive(t, clk, nil)
			svc := &stubService{
				unary: func(int, context.Context) error {
					clk.Advance(time.Millisecond)
					return nil
				},
				stream: func(_ int, ss grpc.ServerStream) error {
					clk.Advance(30 * time.Millisecond)
					<-ss.Context().Done() // nothing to send
					return status.FromContextError(ss.Context().Err()).Err()
				},
			}
			cl := startStub(t, svc, WithAdaptive(set))
			healthyCalls(t, cl, 20)
			th := set.Get("stub")
			for n := range 12 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				err := k.call(ctx, cl)
				cancel()
				if status.Code(err) != codes.DeadlineExceeded {
					t.Fatalf("watch %d: %v, want DEADLINE_EXCEEDED (stats %+v)", n, err, th.Stats())
				}
			}
			if st := th.Stats(); st.Down || st.Downs != 0 || st.Refused != 0 {
				t.Fatalf("after 12 quiet streams: stats %+v, want never down", st)
			}
		})
	}
}

// unaryWithin makes one unary call with deadline d.
func unaryWithin(cl testsvcv1.TestServiceClient, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: "x"})
	return err
}

// One slow answer does not hide a hang: a client of one target with fast
// unary calls (1 ms on the throttle's clock) and a watch whose first
// message came 400 ms after it opened (its accept). The target then
// hangs for unary calls, each waiting 50 ms before its caller gives up;
// the silences count (nearly all accepted attempts took 1 ms), and the
// target is down. With the slowest accepted attempt as the bar (a
// review of the rule's first form), the watch's 400 ms hid the hang for
// as long as it lasted.
func TestWatchDoesNotHideUnaryHang(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set := newAdaptive(t, clk, nil)
	var hung atomic.Bool
	svc := &stubService{
		unary: func(_ int, ctx context.Context) error {
			if hung.Load() {
				clk.Advance(50 * time.Millisecond)
				<-ctx.Done()
				return status.FromContextError(ctx.Err()).Err()
			}
			clk.Advance(time.Millisecond)
			return nil
		},
		stream: func(_ int, ss grpc.ServerStream) error {
			clk.Advance(400 * time.Millisecond) // the first message
			return ss.SendMsg(&testsvcv1.ServerStreamResponse{})
		},
	}
	cl := startStub(t, svc, WithAdaptive(set))
	healthyCalls(t, cl, 20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := kindCalls[1].call(ctx, cl); err != io.EOF {
		t.Fatalf("watch: %v, want its end (EOF)", err)
	}
	hung.Store(true)
	th := set.Get("stub")
	for n := 0; n < 40 && !th.Down(); n++ {
		if err := unaryWithin(cl, 20*time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("hung call %d: %v", n, err)
		}
	}
	if st := th.Stats(); !st.Down {
		t.Errorf("50 ms hangs after a watch's first message at 400 ms: stats %+v, want down", st)
	}
}

// healthyCalls makes n unary calls that must succeed, one after another.
func healthyCalls(t *testing.T, cl testsvcv1.TestServiceClient, n int) {
	t.Helper()
	for i := range n {
		if err := unaryWithin(cl, 10*time.Second); err != nil {
			t.Fatalf("healthy call %d: %v", i, err)
		}
	}
}
