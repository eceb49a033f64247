package testsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ctxT returns a context that ends with the test, bounded so that no RPC
// of the test can hang.
func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds, failing the test when ctx ends first.
// It is for state that another goroutine reaches with no event to wait on.
func waitFor(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal("condition not reached before the deadline")
		case <-time.After(time.Millisecond):
		}
	}
}

func counts(c *Chain) []int64 {
	var n []int64
	for _, t := range c.Tiers() {
		n = append(n, t.Received(Unary))
	}
	return n
}

func TestHealthyChainAllKinds(t *testing.T) {
	c := New(t, Config{})
	ctx := ctxT(t, 10*time.Second)
	cl := c.Client()

	resp, err := cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: "u1", Payload: []byte("x")})
	if err != nil {
		t.Fatalf("Unary: %v", err)
	}
	if resp.GetId() != "u1" || resp.GetServedBy() != "payment" {
		t.Fatalf("Unary: got id %q served by %q, want u1 served by payment", resp.GetId(), resp.GetServedBy())
	}

	ss, err := cl.ServerStream(ctx, &testsvcv1.ServerStreamRequest{Id: "s", Count: 5})
	if err != nil {
		t.Fatalf("ServerStream: %v", err)
	}
	for i := range int32(5) {
		m, err := ss.Recv()
		if err != nil {
			t.Fatalf("ServerStream Recv %d: %v", i, err)
		}
		if m.GetSeq() != i {
			t.Fatalf("ServerStream message %d: got seq %d", i, m.GetSeq())
		}
	}
	if _, err := ss.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("ServerStream end: got %v, want io.EOF", err)
	}

	cs, err := cl.ClientStream(ctx)
	if err != nil {
		t.Fatalf("ClientStream: %v", err)
	}
	for i := range 4 {
		if err := cs.Send(&testsvcv1.ClientStreamRequest{Id: strconv.Itoa(i)}); err != nil {
			t.Fatalf("ClientStream Send: %v", err)
		}
	}
	csResp, err := cs.CloseAndRecv()
	if err != nil {
		t.Fatalf("ClientStream CloseAndRecv: %v", err)
	}
	if got, want := fmt.Sprint(csResp.GetIds()), "[0 1 2 3]"; got != want {
		t.Fatalf("ClientStream ids: got %s, want %s", got, want)
	}

	bs, err := cl.Bidi(ctx)
	if err != nil {
		t.Fatalf("Bidi: %v", err)
	}
	for i := range 3 {
		id := strconv.Itoa(i)
		if err := bs.Send(&testsvcv1.BidiRequest{Id: id}); err != nil {
			t.Fatalf("Bidi Send: %v", err)
		}
		m, err := bs.Recv()
		if err != nil {
			t.Fatalf("Bidi Recv: %v", err)
		}
		if m.GetId() != id || m.GetSeq() != int32(i) {
			t.Fatalf("Bidi: got id %q seq %d, want %q seq %d", m.GetId(), m.GetSeq(), id, i)
		}
	}
	if err := bs.CloseSend(); err != nil {
		t.Fatalf("Bidi CloseSend: %v", err)
	}
	if _, err := bs.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Bidi end: got %v, want io.EOF", err)
	}

	for _, tier := range c.Tiers() {
		for k := range numKinds {
			if got := tier.Received(k); got != 1 {
				t.Errorf("%s received %d %s calls, want 1", tier.Name(), got, k)
			}
			if got := tier.Attempts(k); got != 1 {
				t.Errorf("%s: %d %s attempts sent to it, want 1", tier.Name(), got, k)
			}
		}
	}
}

// retryOnEveryHop puts a go-grpc-middleware retry interceptor with max
// attempts on every hop.
func retryOnEveryHop(max uint) func(int) []grpc.DialOption {
	return func(int) []grpc.DialOption {
		return []grpc.DialOption{grpc.WithChainUnaryInterceptor(retry.UnaryClientInterceptor(
			retry.WithMax(max),
			retry.WithCodes(codes.Unavailable),
			retry.WithBackoff(retry.BackoffLinear(time.Millisecond)),
		))}
	}
}

// builtinRetry turns on grpc-go's own retry policy with maxAttempts on
// every hop.
func builtinRetry(maxAttempts int) func(int) []grpc.DialOption {
	sc := fmt.Sprintf(`{"methodConfig":[{"name":[{"service":"stormguard.testsvc.v1.TestService"}],
		"retryPolicy":{"maxAttempts":%d,"initialBackoff":"0.001s","maxBackoff":"0.002s",
		"backoffMultiplier":1.0,"retryableStatusCodes":["UNAVAILABLE"]}}]}`, maxAttempts)
	return func(int) []grpc.DialOption {
		return []grpc.DialOption{grpc.WithDefaultServiceConfig(sc)}
	}
}

// TestNaiveRetryStorm reproduces the storm of DESIGN.md: with payment down
// and every hop retrying, one user request multiplies at every tier.
func TestNaiveRetryStorm(t *testing.T) {
	tests := []struct {
		name string
		dial func(int) []grpc.DialOption
		want []int64 // calls received at gateway, order, payment
	}{
		{"go-grpc-middleware WithMax(3)", retryOnEveryHop(3), []int64{3, 9, 27}},
		{"go-grpc-middleware WithMax(2)", retryOnEveryHop(2), []int64{2, 4, 8}},
		{"grpc-go retry policy maxAttempts 3", builtinRetry(3), []int64{3, 9, 27}},
		{"no retries", nil, []int64{1, 1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(t, Config{DialOptions: tt.dial})
			c.Tier("payment").SetDown(codes.Unavailable)
			_, err := c.Client().Unary(ctxT(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "storm"})
			if got := status.Code(err); got != codes.Unavailable {
				t.Fatalf("user got %v (%v), want Unavailable", got, err)
			}
			if got := counts(c); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("calls received (gateway, order, payment): got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDownWithCode(t *testing.T) {
	c := New(t, Config{})
	pay := c.Tier("payment")
	pay.SetDown(codes.ResourceExhausted)
	ctx := ctxT(t, 5*time.Second)
	_, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{})
	if got := status.Code(err); got != codes.ResourceExhausted {
		t.Fatalf("down with ResourceExhausted: user got %v, want ResourceExhausted", got)
	}
	pay.SetUp()
	if _, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{}); err != nil {
		t.Fatalf("after SetUp: %v", err)
	}
	if got, want := pay.Failed(), int64(1); got != want {
		t.Fatalf("payment failed %d calls, want %d", got, want)
	}
}

// TestFlaky checks that p=0.1 over 4000 calls lands within five standard
// deviations of the binomial mean (sd = sqrt(n p (1-p)) = 19): the seeded
// source makes the draws repeatable, the bound makes the test sound.
func TestFlaky(t *testing.T) {
	c := New(t, Config{Seed: 7})
	pay := c.Tier("payment")
	pay.SetFlaky(0.1)
	const workers, perWorker, p = 8, 500, 0.1
	const n = workers * perWorker
	ctx := ctxT(t, 60*time.Second)
	var (
		mu     sync.Mutex
		failed int
		other  error
		wg     sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for range perWorker {
				_, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{})
				if err == nil {
					continue
				}
				mu.Lock()
				if status.Code(err) == codes.Unavailable {
					failed++
				} else {
					other = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if other != nil {
		t.Fatalf("flaky failure with %v, want Unavailable", other)
	}
	mean, sd := n*p, math.Sqrt(n*p*(1-p))
	if math.Abs(float64(failed)-mean) > 5*sd {
		t.Fatalf("flaky p=%.1f: %d of %d failed, want %.0f +- %.0f", p, failed, n, mean, 5*sd)
	}
	if got := pay.Failed(); got != int64(failed) {
		t.Fatalf("payment counted %d failures, user saw %d", got, failed)
	}
	if got := pay.Received(Unary); got != n {
		t.Fatalf("payment received %d calls, want %d", got, n)
	}
}

func TestCapacityConcurrent(t *testing.T) {
	c := New(t, Config{})
	pay := c.Tier("payment")
	pay.SetCapacity(Capacity{Concurrent: 2})
	// Hold calls inside payment so that they stay concurrent.
	pay.SetLatency(time.Hour)
	ctx := ctxT(t, 10*time.Second)
	held, cancelHeld := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { _, _ = c.Client().Unary(held, &testsvcv1.UnaryRequest{}) })
	}
	// Until both hold a slot (a call is counted as received before it
	// takes one).
	waitFor(t, ctx, func() bool { return pay.faults.inflight.Load() == 2 })
	_, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{})
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("third concurrent call: got %v, want Unavailable (shed)", got)
	}
	cancelHeld()
	wg.Wait()
	// The servers see the cancellation a moment after the clients do.
	waitFor(t, ctx, func() bool { return pay.faults.inflight.Load() == 0 })
	pay.SetLatency(0)
	if _, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{}); err != nil {
		t.Fatalf("after the held calls ended: %v", err)
	}
}

func TestCapacityPerSecond(t *testing.T) {
	c := New(t, Config{})
	f := c.Tier("payment").faults
	f.capacity = Capacity{PerSecond: 3}
	sec := time.Unix(1000, 0)
	for i := range 3 {
		if _, err := f.admit(sec); err != nil {
			t.Fatalf("call %d within capacity: %v", i, err)
		}
	}
	if _, err := f.admit(sec.Add(999 * time.Millisecond)); status.Code(err) != codes.Unavailable {
		t.Fatalf("fourth call in the same second: got %v, want Unavailable", err)
	}
	if _, err := f.admit(sec.Add(time.Second)); err != nil {
		t.Fatalf("first call of the next second: %v", err)
	}
}

func TestLatencyEndsWithContext(t *testing.T) {
	c := New(t, Config{})
	c.Tier("payment").SetLatency(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{})
	if got := status.Code(err); got != codes.DeadlineExceeded {
		t.Fatalf("got %v, want DeadlineExceeded", got)
	}
}

// SetTail's share of calls waits the tail's delay, the rest the latency,
// drawn from the seeded source.
func TestTail(t *testing.T) {
	f := newFaults(7)
	f.latency.Store(int64(time.Millisecond))
	f.tail.Store(int64(time.Second))
	f.tailP.Store(math.Float64bits(0.02))
	slow := 0
	for range 10000 {
		switch d := f.wait(); d {
		case time.Second:
			slow++
		case time.Millisecond:
		default:
			t.Fatalf("wait %v, want the latency or the tail's", d)
		}
	}
	if slow < 150 || slow > 250 {
		t.Errorf("%d of 10000 calls waited the tail's, want about 2 %%", slow)
	}
}

func TestKillAndRestart(t *testing.T) {
	c := New(t, Config{})
	pay := c.Tier("payment")
	ctx := ctxT(t, 10*time.Second)
	if _, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{}); err != nil {
		t.Fatalf("before kill: %v", err)
	}
	pay.Kill()
	_, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{})
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("while killed: got %v, want Unavailable", err)
	}
	if got := pay.Received(Unary); got != 1 {
		t.Fatalf("a killed payment received a call: got %d, want 1", got)
	}
	if got := pay.Attempts(Unary); got != 2 {
		t.Fatalf("attempts sent to payment: got %d, want 2", got)
	}
	pay.Restart()
	// Order's connection to payment reconnects with a short backoff, and
	// no call option of the edge's request can wait for a connection two
	// hops down (WaitForReady on it would wait for the edge's own
	// connection only). So ask again until payment answers: at most 100
	// times, 10 ms apart, and never past the test's context.
	resp, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{Id: "back"})
	for i := 0; err != nil && i < 100; i++ {
		select {
		case <-ctx.Done():
			t.Fatalf("payment did not come back: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		resp, err = c.Client().Unary(ctx, &testsvcv1.UnaryRequest{Id: "back"})
	}
	if err != nil || resp.GetServedBy() != "payment" {
		t.Fatalf("after restart: got %v, %v", resp, err)
	}
}

func TestStatsService(t *testing.T) {
	c := New(t, Config{})
	ctx := ctxT(t, 5*time.Second)
	c.Tier("payment").SetDown(codes.Unavailable)
	_, _ = c.Client().Unary(ctx, &testsvcv1.UnaryRequest{})
	stats := testsvcv1.NewStatsServiceClient(c.edge)
	resp, err := stats.GetStats(ctx, &testsvcv1.GetStatsRequest{})
	if err != nil {
		t.Fatalf("GetStats: %v", err)
	}
	if resp.GetTier() != "gateway" || resp.GetReceived()["unary"] != 1 || resp.GetFailed() != 1 {
		t.Fatalf("GetStats: got %v, want gateway with 1 unary call, 1 failed", resp)
	}
}

func TestKindString(t *testing.T) {
	if got := Bidi.String(); got != "bidi" {
		t.Fatalf("Bidi.String() = %q", got)
	}
	if got := Kind(9).String(); got != "Kind(9)" {
		t.Fatalf("Kind(9).String() = %q", got)
	}
}

// TestCapacityCountsAcceptedOnly: a call shed for concurrency does not use
// the per-second quota, and a late arrival stamped in an earlier second
// does not restart the current second's count.
func TestCapacityCountsAcceptedOnly(t *testing.T) {
	f := newFaults(1)
	f.capacity = Capacity{PerSecond: 2, Concurrent: 1}
	sec := time.Unix(1000, 0)
	releaseA, err := f.admit(sec)
	if err != nil {
		t.Fatalf("first call: %v", err)
	}
	if _, err := f.admit(sec); status.Code(err) != codes.Unavailable {
		t.Fatalf("second concurrent call: got %v, want shed", err)
	}
	releaseA()
	if _, err := f.admit(sec); err != nil {
		t.Fatalf("the shed call used the quota: %v", err)
	}

	g := newFaults(1)
	g.capacity = Capacity{PerSecond: 2}
	at := []time.Time{time.Unix(11, 0), time.Unix(11, 0), time.Unix(10, 999e6), time.Unix(11, 0)}
	accepted := 0
	for _, now := range at {
		if _, err := g.admit(now); err == nil {
			accepted++
		}
	}
	if accepted != 2 {
		t.Fatalf("accepted %d calls in second 11 (one stamped 10.999), want 2", accepted)
	}
}

// TestStreamFaultCountsFailures: Streams counts the streams that failed,
// not those that ended before the fault point.
func TestStreamFaultCountsFailures(t *testing.T) {
	c := New(t, Config{Tiers: []string{"payment"}})
	c.Tier("payment").SetStreamFault(StreamFault{AfterSend: 5, Streams: 1})
	recv := func(count int32) error {
		ss, err := c.Client().ServerStream(ctxT(t, 10*time.Second), &testsvcv1.ServerStreamRequest{Count: count})
		if err != nil {
			return err
		}
		for {
			if _, err := ss.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
	}
	if err := recv(2); err != nil {
		t.Fatalf("a 2-message stream: %v, want success (it ends before the fault point)", err)
	}
	if err := recv(10); status.Code(err) != codes.Unavailable {
		t.Fatalf("a 10-message stream: %v, want the injected failure", err)
	}
	if err := recv(10); err != nil {
		t.Fatalf("after the one failure: %v, want success", err)
	}
}

// TestRegister: Config.Register puts extra services on each tier's
// server, again after a restart.
func TestRegister(t *testing.T) {
	hs := make([]*health.Server, len(DefaultTiers))
	for i := range hs {
		hs[i] = health.NewServer()
		hs[i].SetServingStatus("tier", healthpb.HealthCheckResponse_ServingStatus(i+1))
	}
	c := New(t, Config{Register: func(tier int, srv *grpc.Server) { healthpb.RegisterHealthServer(srv, hs[tier]) }})
	ctx := ctxT(t, 10*time.Second)
	check := func(tier int) {
		t.Helper()
		// Right after a restart the channel may still hold the old
		// transport, whose call then fails with UNAVAILABLE: a client
		// tries again, until the deadline.
		var resp *healthpb.HealthCheckResponse
		var err error
		for {
			resp, err = healthpb.NewHealthClient(c.Conn(tier)).Check(ctx, &healthpb.HealthCheckRequest{Service: "tier"}, grpc.WaitForReady(true))
			if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("tier %d: Check: %v", tier, err)
		}
		if got, want := resp.GetStatus(), healthpb.HealthCheckResponse_ServingStatus(tier+1); got != want {
			t.Fatalf("tier %d: got %v, want %v (its own health server)", tier, got, want)
		}
	}
	for i := range DefaultTiers {
		check(i)
	}
	c.Tier("payment").Restart()
	check(2)
}

// A bare chain serves through every tier without the harness's
// interceptors: nothing is counted, since the counting ones are not there.
func TestBareChain(t *testing.T) {
	c := New(t, Config{Bare: true})
	resp, err := c.Client().Unary(ctxT(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "b"})
	if err != nil {
		t.Fatalf("Unary: %v", err)
	}
	if resp.GetServedBy() != "payment" {
		t.Errorf("served by %q, want payment", resp.GetServedBy())
	}
	for _, tier := range c.Tiers() {
		if got := tier.Received(Unary) + tier.Attempts(Unary); got != 0 {
			t.Errorf("%s counted %d requests and attempts on a bare chain, want 0 (no counting interceptor)", tier.Name(), got)
		}
	}
}
