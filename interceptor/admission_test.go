package interceptor

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// gateServer is a test service whose handlers block until the gate opens;
// entered receives one value per handler that started.
type gateServer struct {
	testsvcv1.UnimplementedTestServiceServer
	gate    chan struct{}
	entered chan struct{}
	runs    atomic.Int64
}

func (g *gateServer) wait(ctx context.Context) error {
	g.runs.Add(1)
	g.entered <- struct{}{}
	select {
	case <-g.gate:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func (g *gateServer) Unary(ctx context.Context, req *testsvcv1.UnaryRequest) (*testsvcv1.UnaryResponse, error) {
	if err := g.wait(ctx); err != nil {
		return nil, err
	}
	return &testsvcv1.UnaryResponse{Id: req.GetId()}, nil
}

func (g *gateServer) ServerStream(req *testsvcv1.ServerStreamRequest, s grpc.ServerStreamingServer[testsvcv1.ServerStreamResponse]) error {
	if err := g.wait(s.Context()); err != nil {
		return err
	}
	return s.Send(&testsvcv1.ServerStreamResponse{})
}

// admissionServer serves a gateServer over bufconn behind the server
// interceptors of i, with a counter of the requests that arrived in front
// of them.
type admissionServer struct {
	*gateServer
	i       *Interceptors
	arrived atomic.Int64
	lis     *bufconn.Listener
}

func startAdmission(t *testing.T, opts ...Option) *admissionServer {
	t.Helper()
	s := &admissionServer{
		gateServer: &gateServer{gate: make(chan struct{}), entered: make(chan struct{}, 16)},
		i:          mustNew(t, opts...),
		lis:        bufconn.Listen(1 << 20),
	}
	count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		s.arrived.Add(1)
		return h(ctx, req)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(count, s.i.UnaryServer()),
		grpc.ChainStreamInterceptor(s.i.StreamServer()),
	)
	testsvcv1.RegisterTestServiceServer(srv, s.gateServer)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(s.lis)
	}()
	t.Cleanup(func() {
		s.open()
		srv.Stop()
		<-done
	})
	return s
}

// open lets every blocked handler finish, once.
var openMu sync.Mutex

func (g *gateServer) open() {
	openMu.Lock()
	defer openMu.Unlock()
	select {
	case <-g.gate:
	default:
		close(g.gate)
	}
}

func (s *admissionServer) client(t *testing.T, opts ...grpc.DialOption) testsvcv1.TestServiceClient {
	t.Helper()
	opts = append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return s.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecureCreds()),
	}, opts...)
	cc, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return testsvcv1.NewTestServiceClient(cc)
}

// hold starts n unary calls that block in the handler, and returns once
// all are inside it; the calls end when the gate opens.
func (s *admissionServer) hold(t *testing.T, c testsvcv1.TestServiceClient, n int) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = c.Unary(ctx, &testsvcv1.UnaryRequest{Id: "held"})
		}()
	}
	for range n {
		select {
		case <-s.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("held calls did not reach the handler")
		}
	}
	t.Cleanup(func() { s.open(); wg.Wait() })
	return &wg
}

// pushbackOf returns the pushback trailer, or "" when none.
func pushbackOf(tr metadata.MD) string {
	if v := tr.Get(MetadataPushback); len(v) == 1 {
		return v[0]
	}
	return ""
}

// fixedLimit is a limit of n that does not move.
func fixedLimit(n int) admission.Config {
	return admission.Config{MaxInFlight: n}
}

// TestAdmissionShedsRetriesFirst: with a limit of 4 (retries may use 2),
// a retry is refused once 2 requests are in flight, while a first attempt
// is admitted; at 4, a first attempt is refused. Both with a positive
// pushback: a retry elsewhere may succeed. Refused requests never reach
// the handler.
func TestAdmissionShedsRetriesFirst(t *testing.T) {
	s := startAdmission(t, WithAdmission(fixedLimit(4)))
	c := s.client(t, grpc.WithDisableRetry())
	s.hold(t, c, 2)

	retry := metadata.AppendToOutgoingContext(ctxTimeout(t, 10*time.Second), MetadataAttempt, "1")
	var tr metadata.MD
	_, err := c.Unary(retry, &testsvcv1.UnaryRequest{Id: "retry"}, grpc.Trailer(&tr))
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("retry at 2 of 4: got %v, want Unavailable", err)
	}
	if ms, err := strconv.Atoi(pushbackOf(tr)); err != nil || ms < 1 {
		t.Fatalf("retry at 2 of 4: pushback %q, want >= 1 ms (another replica may serve it)", pushbackOf(tr))
	}
	upstream := metadata.AppendToOutgoingContext(ctxTimeout(t, 10*time.Second), MetadataUpstreamRetries, "2")
	s.hold(t, c, 1) // a first attempt is admitted: 3 in flight
	if _, err := c.Unary(upstream, &testsvcv1.UnaryRequest{Id: "upstream"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("caller retrying at 3 of 4: got %v, want Unavailable", err)
	}
	s.hold(t, c, 1) // 4 in flight
	tr = nil
	_, err = c.Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "first"}, grpc.Trailer(&tr))
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("first attempt at 4 of 4: got %v, want Unavailable", err)
	}
	if ms, err := strconv.Atoi(pushbackOf(tr)); err != nil || ms < 1 {
		t.Fatalf("first attempt at 4 of 4: pushback %q, want >= 1 ms", pushbackOf(tr))
	}
	if got := s.runs.Load(); got != 4 {
		t.Fatalf("handler runs: got %d, want 4 (the held calls only)", got)
	}
	st := s.i.Admission().Stats()
	if st.InFlight != 4 || st.RejectedLimit != 3 {
		t.Fatalf("stats: got %+v, want 4 in flight and 3 refused at the limit", st)
	}
}

// TestAdmissionReleases: a finished unary call and a finished stream free
// their slots.
func TestAdmissionReleases(t *testing.T) {
	s := startAdmission(t, WithAdmission(fixedLimit(1)))
	c := s.client(t, grpc.WithDisableRetry())
	s.open()
	for i := range 3 {
		if _, err := c.Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "x"}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		<-s.entered
		st, err := c.ServerStream(ctxTimeout(t, 10*time.Second), &testsvcv1.ServerStreamRequest{})
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		for err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.OK && !errors.Is(err, io.EOF) {
			t.Fatalf("stream %d: %v", i, err)
		}
		<-s.entered
	}
	if got := s.i.Admission().InFlight(); got != 0 {
		t.Fatalf("in flight after the calls: got %d, want 0", got)
	}
}

// TestAdmissionAbandoned: a unary call whose handler fails after its
// caller left is released abandoned (it ended, but the server served
// nothing: see admission.Abandoned); one that fails while its caller
// waits is a failure, one that succeeds a success, and an answer that
// comes after the caller left, success or not, abandoned too (a FIFO
// pool that ignores cancellation serves no one then). A handler that
// returns DeadlineExceeded while its caller waits (a call below it timed
// out) is abandoned too: a middle tier whose calls to a slow dependency
// time out serves nothing, and read as failing fast it let in at once
// every request it held (bench scenarios, slow dependency: 3 of 6 runs
// served 28-38 % of payment's capacity, with every request it held
// released into payment's queue in bursts).
func TestAdmissionAbandoned(t *testing.T) {
	i := mustNew(t, WithAdmission(admission.Config{}))
	h := i.UnaryServer()
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/M"}
	ctx, cancel := context.WithCancel(ctxTimeout(t, time.Minute))
	_, err := h(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
		cancel() // the caller leaves while the handler runs
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	})
	if status.Code(err) != codes.Canceled {
		t.Fatalf("abandoned call: %v, want Canceled", err)
	}
	if _, err := h(ctxTimeout(t, time.Minute), nil, info, func(context.Context, any) (any, error) { return nil, errUnavailable }); status.Code(err) != codes.Unavailable {
		t.Fatalf("failed call: %v, want Unavailable", err)
	}
	if _, err := h(ctxTimeout(t, time.Minute), nil, info, func(context.Context, any) (any, error) { return nil, nil }); err != nil {
		t.Fatalf("call: %v", err)
	}
	if _, err := h(ctxTimeout(t, time.Minute), nil, info, func(context.Context, any) (any, error) {
		return nil, status.Error(codes.DeadlineExceeded, "the call below timed out")
	}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call whose call below timed out: %v, want DeadlineExceeded", err)
	}
	late, cancelLate := context.WithCancel(ctxTimeout(t, time.Minute))
	if _, err := h(late, nil, info, func(context.Context, any) (any, error) {
		cancelLate() // the caller left; the handler answers anyway
		return nil, nil
	}); err != nil {
		t.Fatalf("call answered after its caller left: %v", err)
	}
	if st := i.Admission().Stats(); st.Abandoned != 3 || st.InFlight != 0 {
		t.Fatalf("stats %+v: want 3 abandoned, none in flight", st)
	}
}

// TestAdmissionStreamRefused: a stream over the limit is refused before
// its handler, with the pushback trailer.
func TestAdmissionStreamRefused(t *testing.T) {
	s := startAdmission(t, WithAdmission(fixedLimit(1)))
	c := s.client(t, grpc.WithDisableRetry())
	s.hold(t, c, 1)
	st, err := c.ServerStream(ctxTimeout(t, 10*time.Second), &testsvcv1.ServerStreamRequest{})
	if err == nil {
		_, err = st.Recv()
	}
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("stream at 1 of 1: got %v, want Unavailable", err)
	}
	if ms, perr := strconv.Atoi(pushbackOf(st.Trailer())); perr != nil || ms < 1 {
		t.Fatalf("stream at 1 of 1: pushback %q, want >= 1 ms", pushbackOf(st.Trailer()))
	}
	if got := s.runs.Load(); got != 1 {
		t.Fatalf("handler runs: got %d, want 1", got)
	}
}

// overload drives l, on clk, into overload: windows of 1 s in which 40
// requests arrive and 10 complete, until it is overloaded (suspect
// first, for up to 60 windows); then it sets clk to the real time, at
// which the RPCs' deadlines are measured. It returns the permits still
// held.
func overload(t *testing.T, l *admission.Limiter, clk *clock.Fake) []admission.Permit {
	t.Helper()
	var held []admission.Permit
	for range 100 {
		for range 40 {
			p, err := l.Acquire(admission.ClassFirst, time.Time{})
			if err != nil && !l.Overloaded() {
				t.Fatalf("Acquire while overloading: %v", err)
			}
			if err == nil {
				held = append(held, p)
			}
		}
		clk.Advance(time.Second)
		for _, p := range held[:10] {
			p.Release(admission.Measured)
		}
		held = held[10:]
		if l.Overloaded() {
			break
		}
	}
	if !l.Overloaded() {
		t.Fatalf("not overloaded after 100 s of 40 arrivals and 10 completions a second: %+v", l.Stats())
	}
	clk.Set(time.Now())
	// Nothing has succeeded for the time the clock jumped, so the next
	// request would go in as a trial (see admission's Limiter): take it
	// here, and the server refuses what comes after it.
	if p, err := l.Acquire(admission.ClassFirst, time.Time{}); err == nil {
		held = append(held, p)
	}
	if !l.Overloaded() {
		t.Fatal("not overloaded after the trial went in")
	}
	t.Cleanup(func() {
		for _, p := range held {
			p.Release(admission.Ignored)
		}
	})
	return held
}

// TestAdmissionDeadline: while the server is overloaded and expects a
// request to need about 7 s, one with 5 s left is refused with "do not
// retry", and one without a deadline is refused for the overload with a
// pushback; while it is not overloaded, neither is refused, however long
// the latency.
func TestAdmissionDeadline(t *testing.T) {
	// The fake clock ends up at about the real time, which the RPC's
	// deadline is measured in.
	clk := clock.NewFake(time.Now().Add(-time.Hour))
	s := startAdmission(t, WithAdmission(admission.Config{Window: time.Second, Clock: clk}))
	l := s.i.Admission()
	overload(t, l, clk)
	if got := l.Latency(); got < 6*time.Second {
		t.Fatalf("Latency: got %v, want more than 6s", got)
	}
	c := s.client(t, grpc.WithDisableRetry())
	var tr metadata.MD
	_, err := c.Unary(ctxTimeout(t, 5*time.Second), &testsvcv1.UnaryRequest{Id: "short"}, grpc.Trailer(&tr))
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("5s left, %v expected: got %v, want Unavailable", l.Latency(), err)
	}
	if got := pushbackOf(tr); got != "-1" || len(tr.Get(MetadataShed)) == 0 {
		t.Fatalf("5s left: trailer %v, want pushback -1 and %s", tr, MetadataShed)
	}
	if got := l.Stats().RejectedDeadline; got != 1 {
		t.Fatalf("RejectedDeadline: got %d, want 1", got)
	}
	tr = nil
	_, err = c.Unary(context.Background(), &testsvcv1.UnaryRequest{Id: "no deadline"}, grpc.Trailer(&tr))
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("no deadline, overloaded: got %v, want Unavailable", err)
	}
	if ms, perr := strconv.Atoi(pushbackOf(tr)); perr != nil || ms < 10 || ms > 30 {
		t.Fatalf("no deadline, overloaded: pushback %q, want about the 20 ms target", pushbackOf(tr))
	}
	if got := s.runs.Load(); got != 0 {
		t.Fatalf("handler runs: got %d, want 0", got)
	}
}

// TestAdmissionLongLatencyNotRefused: a server that is not overloaded
// admits a request whose deadline is shorter than the latency it can
// expect: its callers get their answers late, as without admission
// control, not refusals.
func TestAdmissionLongLatencyNotRefused(t *testing.T) {
	clk := clock.NewFake(time.Now().Add(-10 * time.Second))
	s := startAdmission(t, WithAdmission(admission.Config{Window: time.Second, Clock: clk}))
	l := s.i.Admission()
	var held []admission.Permit
	for range 100 { // 100 in flight, 10 s each: a closed loop
		p, err := l.Acquire(admission.ClassFirst, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	for range 10 {
		clk.Advance(time.Second)
		for i := range 10 { // 10 complete and 10 arrive each second
			held[i].Release(admission.Measured)
			held[i], _ = l.Acquire(admission.ClassFirst, time.Time{})
		}
		held = append(held[10:], held[:10]...)
	}
	defer func() {
		for _, p := range held {
			p.Release(admission.Ignored)
		}
	}()
	if l.Overloaded() || l.Latency() < 5*time.Second {
		t.Fatalf("setup: overloaded %v, latency %v; want a closed loop at about 10 s", l.Overloaded(), l.Latency())
	}
	c := s.client(t, grpc.WithDisableRetry())
	s.open()
	if _, err := c.Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "x"}); err != nil {
		t.Fatalf("10s left of an expected %v, not overloaded: got %v, want served", l.Latency(), err)
	}
}

// TestAdmissionCallerGone: a request whose caller is gone is refused
// before the handler, with the context's code.
func TestAdmissionCallerGone(t *testing.T) {
	var events []Event
	i := mustNew(t, WithAdmission(admission.Config{}), WithObserver(observerFunc(func(_ context.Context, e Event) { events = append(events, e) })))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	_, err := i.UnaryServer()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/svc/M"}, func(context.Context, any) (any, error) {
		ran = true
		return nil, nil
	})
	if got := status.Code(err); got != codes.Canceled || ran {
		t.Fatalf("canceled caller: got %v (handler ran: %v), want Canceled before the handler", err, ran)
	}
	dctx, dcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer dcancel()
	_, err = i.UnaryServer()(dctx, nil, &grpc.UnaryServerInfo{FullMethod: "/svc/M"}, func(context.Context, any) (any, error) {
		ran = true
		return nil, nil
	})
	if got := status.Code(err); got != codes.DeadlineExceeded || ran {
		t.Fatalf("expired caller: got %v (handler ran: %v), want DeadlineExceeded before the handler", err, ran)
	}
	var refused []AdmissionReason
	for _, e := range events {
		if e.Kind == EventAdmissionRefused {
			refused = append(refused, e.Admission)
		}
	}
	if len(refused) != 2 || refused[0] != AdmissionCallerGone || refused[1] != AdmissionCallerGone {
		t.Fatalf("refusal events: got %v, want two caller_gone", refused)
	}
	if got := i.Admission().InFlight(); got != 0 {
		t.Fatalf("in flight: got %d, want 0", got)
	}
}

type observerFunc func(context.Context, Event)

func (f observerFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// TestAdmissionStormguardClient: stormguard's client waits the pushback of
// each refusal before it retries (a refused retry, too, may succeed on
// another replica), and stops when its attempts are used up: 3 attempts,
// 2 waits of the pushback, no handler run.
func TestAdmissionStormguardClient(t *testing.T) {
	s := startAdmission(t, WithAdmission(fixedLimit(2)))
	s.hold(t, s.client(t, grpc.WithDisableRetry()), 2)
	var sl sleeps
	c := s.client(t, mustNew(t, sl.option()).DialOptions()...)
	before := s.arrived.Load()
	_, err := c.Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "x"})
	var se *Error
	if !errors.As(err, &se) || se.Reason != StopAttempts || se.Attempts != 3 {
		t.Fatalf("got %v, want 3 attempts, then attempts used up", err)
	}
	if got := s.arrived.Load() - before; got != 3 {
		t.Fatalf("attempts at the server: got %d, want 3", got)
	}
	if len(sl.d) != 2 || sl.d[0] < time.Millisecond || sl.d[1] < time.Millisecond {
		t.Fatalf("waits: got %v, want two of the pushback (>= 1ms)", sl.d)
	}
}

// TestAdmissionGRPCRetry: grpc-go's built-in retry (3 attempts,
// UNAVAILABLE) honours the pushback: it retries each refusal after the
// delay, and stops when its attempts are used up.
func TestAdmissionGRPCRetry(t *testing.T) {
	s := startAdmission(t, WithAdmission(fixedLimit(2)))
	s.hold(t, s.client(t, grpc.WithDisableRetry()), 2)
	c := s.client(t, grpc.WithDefaultServiceConfig(`{"methodConfig":[{"name":[{"service":"stormguard.testsvc.v1.TestService"}],
		"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.01s","maxBackoff":"0.1s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`))
	before := s.arrived.Load()
	_, err := c.Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "x"})
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	if got := s.arrived.Load() - before; got != 3 {
		t.Fatalf("attempts at the server: got %d, want 3 (each refusal retried after its pushback)", got)
	}
}

// TestAdmissionGGMRetry: go-grpc-middleware's retry ignores pushback; it
// makes its 3 attempts, and both retries are refused in the retry class
// before the handler.
func TestAdmissionGGMRetry(t *testing.T) {
	s := startAdmission(t, WithAdmission(fixedLimit(2)))
	s.hold(t, s.client(t, grpc.WithDisableRetry()), 2)
	c := s.client(t, grpc.WithDisableRetry(), grpc.WithChainUnaryInterceptor(retry.UnaryClientInterceptor(
		retry.WithMax(3), retry.WithCodes(codes.Unavailable), retry.WithBackoff(retry.BackoffLinear(time.Millisecond)))))
	before := s.arrived.Load()
	_, err := c.Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "x"})
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	if got := s.arrived.Load() - before; got != 3 {
		t.Fatalf("attempts at the server: got %d, want 3", got)
	}
	if got := s.runs.Load(); got != 2 {
		t.Fatalf("handler runs: got %d, want 2 (the held calls)", got)
	}
}

func TestWithAdmissionInvalid(t *testing.T) {
	if _, err := New(WithAdmission(admission.Config{MaxInFlight: -1})); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("New(WithAdmission(MaxInFlight -1)): got %v, want ErrInvalidOption", err)
	}
	if i := mustNew(t); i.Admission() != nil {
		t.Fatalf("Admission without WithAdmission: got a limiter, want nil")
	}
}

// TestAdmissionRefusalsDoNotOpenBreaker: a stormguard client does not
// count admission refusals (MetadataShed) against its breaker: 20 refused
// calls leave a breaker that opens at 5 failures closed.
func TestAdmissionRefusalsDoNotOpenBreaker(t *testing.T) {
	s := startAdmission(t, WithAdmission(fixedLimit(1)))
	s.hold(t, s.client(t, grpc.WithDisableRetry()), 1)
	var opened atomic.Int64
	set, err := breaker.NewSet(breaker.Config{MinimumCalls: 5, OnStateChange: func(_ string, _, to breaker.State) {
		if to == breaker.Open {
			opened.Add(1)
		}
	}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := s.client(t, mustNew(t, WithMaxAttempts(1), WithBreaker(set)).DialOptions()...)
	for i := range 20 {
		var tr metadata.MD
		_, err := c.Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "x"}, grpc.Trailer(&tr))
		if status.Code(err) != codes.Unavailable || len(tr.Get(MetadataShed)) == 0 {
			t.Fatalf("call %d: got %v with trailer %v, want Unavailable marked %s", i, err, tr, MetadataShed)
		}
	}
	if got := opened.Load(); got != 0 {
		t.Fatalf("breaker opened %d times on admission refusals, want 0", got)
	}
}

// TestAdmissionShedNotPassedUp: when payment's admission control refuses
// order's call, order's answer to its caller says "do not retry", but not
// MetadataShed: the refusal concerns order, the tier that was refused
// (protocol version 2; review finding 3: passed up by every tier, it made
// the throttles of healthy tiers mark their neighbours down).
func TestAdmissionShedNotPassedUp(t *testing.T) {
	payIC := mustNew(t, WithAdmission(fixedLimit(1)))
	c := testsvc.New(t, testsvc.Config{
		Tiers: []string{"order", "payment"},
		DialOptions: func(int) []grpc.DialOption {
			return mustNew(t, noWait).DialOptions()
		},
		ServerOptions: func(tier int) []grpc.ServerOption {
			if tier == 1 {
				return payIC.ServerOptions()
			}
			return mustNew(t).ServerOptions()
		},
	})
	pay := c.Tier("payment")
	pay.SetPool(testsvc.Pool{Workers: 1, Service: time.Hour})
	t.Cleanup(pay.StopPool)
	held := make(chan error, 1)
	go func() {
		_, err := c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "held"})
		held <- err
	}()
	// Until the held call has payment's one slot (the harness counts a
	// call as received before admission control takes it).
	for i := 0; payIC.Admission().InFlight() == 0 && i < 10000; i++ {
		time.Sleep(time.Millisecond)
	}
	var tr metadata.MD
	_, err := c.Client().Unary(ctxTimeout(t, 10*time.Second), &testsvcv1.UnaryRequest{Id: "shed"}, grpc.Trailer(&tr))
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	if got := pushbackOf(tr); got != "-1" || len(tr.Get(MetadataShed)) != 0 {
		t.Fatalf("order's trailer %v: want pushback -1 without %s", tr, MetadataShed)
	}
	pay.StopPool()
	<-held
}

// A request that admission control lets in as a trial probes a
// dependency that the tier's own throttle holds down, without the probe
// credit: a tier that admits only its trials (after a hang below it)
// would otherwise gather that credit only after seconds, and each trial
// refused at its own client would end nothing. A call on behalf of any
// other request is refused as before.
func TestAdmissionTrialProbesDownDependency(t *testing.T) {
	admClk := clock.NewFake(time.Now().Add(-time.Hour))
	thrClk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set := newAdaptive(t, thrClk, nil)
	i := mustNew(t, WithAdmission(admission.Config{Window: time.Second, Clock: admClk}), WithAdaptive(set))
	cc := newCC(t)
	th := set.Get(normalizeTarget(cc.Target()))
	markDown(t, th, thrClk)

	l := i.Admission()
	overload(t, l, admClk)
	dep := &fakeInvoker{results: []error{nil}}
	var called, probed int
	handler := func(ctx context.Context, _ any) (any, error) {
		called++
		if in, ok := FromContext(ctx); !ok || !in.Trial {
			t.Error("handler of the trial: request not marked as a trial")
		}
		before := th.Stats().Probes
		err := i.UnaryClient()(ctx, "/svc/M", nil, nil, cc, dep.invoke)
		if th.Stats().Probes > before {
			probed++
		}
		return nil, err
	}
	// A plain request's call is refused by the throttle: no credit.
	plain := &stateCtx{Context: ctxTimeout(t, time.Minute)}
	if err := i.UnaryClient()(plain, "/svc/M", nil, nil, cc, dep.invoke); !errors.Is(err, adaptive.ErrThrottled) || len(dep.seen) != 0 {
		t.Fatalf("call of a plain request to the down dependency: got %v after %d attempts, want ErrThrottled and none", err, len(dep.seen))
	}
	// Nothing served for an hour: the next request goes in as a trial,
	// and its call goes out as the dependency's probe.
	admClk.Advance(time.Hour)
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/Tier"}
	if _, err := i.UnaryServer()(ctxTimeout(t, time.Minute), nil, info, handler); err != nil {
		t.Fatalf("trial request: %v", err)
	}
	if called != 1 || probed != 1 || len(dep.seen) != 1 {
		t.Fatalf("trial: handler ran %d times, probes %d, attempts at the dependency %d; want 1, 1, 1", called, probed, len(dep.seen))
	}
	if th.Down() {
		t.Error("dependency still down after the trial's probe was answered")
	}
	if l.Overloaded() {
		t.Error("still overloaded after the trial was served at once")
	}
}

// A request that carries the trial mark of a tier above serves a trial
// too: its call probes a dependency that this tier's throttle holds down,
// without the probe credit, and carries the mark on; the same request
// without the mark is refused at once, and a forged mark gets no more
// than one probe per probe interval.
func TestTrialMarkProbesAndTravels(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set := newAdaptive(t, clk, nil)
	i := mustNew(t, WithAdaptive(set))
	cc := newCC(t)
	th := set.Get(normalizeTarget(cc.Target()))
	markDown(t, th, clk)

	serve := func(md metadata.MD, dep *fakeInvoker) error {
		ctx := metadata.NewIncomingContext(ctxTimeout(t, time.Minute), md)
		info := &grpc.UnaryServerInfo{FullMethod: "/svc/Tier"}
		_, err := i.UnaryServer()(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
			return nil, i.UnaryClient()(ctx, "/svc/M", nil, nil, cc, dep.invoke)
		})
		return err
	}
	hung := &fakeInvoker{results: []error{errUnavailable}}
	if err := serve(metadata.Pairs(MetadataDepth, "1"), hung); err == nil || len(hung.seen) != 0 {
		t.Fatalf("unmarked request: got %v after %d attempts, want a refusal and none", err, len(hung.seen))
	}
	if err := serve(metadata.Pairs(MetadataDepth, "1", MetadataTrial, "1"), hung); err == nil || len(hung.seen) != 1 {
		t.Fatalf("marked request, dependency still failing: got %v after %d attempts, want a failure after 1 (the probe)", err, len(hung.seen))
	}
	if got := hung.seen[0].md.Get(MetadataTrial); len(got) != 1 || got[0] != "1" {
		t.Errorf("the probe's metadata: %s %q, want \"1\"", MetadataTrial, got)
	}
	// Forged marks in a burst: the probe interval holds them to none
	// until it has passed.
	for range 50 {
		_ = serve(metadata.Pairs(MetadataDepth, "1", MetadataTrial, "1"), hung)
	}
	if len(hung.seen) != 1 {
		t.Fatalf("50 marked requests within the probe interval: %d attempts, want still 1", len(hung.seen))
	}
	clk.Advance(time.Second)
	back := &fakeInvoker{results: []error{nil}}
	if err := serve(metadata.Pairs(MetadataDepth, "1", MetadataTrial, "1"), back); err != nil || len(back.seen) != 1 {
		t.Fatalf("marked request, dependency back: got %v after %d attempts, want success after 1", err, len(back.seen))
	}
	if th.Down() {
		t.Error("dependency still down after the trial's probe was answered")
	}
}

// markDown marks th's target down on one failure with its connection
// broken, a second after an accept, so that a probe needs a whole credit
// (1/ProbeRatio requests), and lets the probe interval pass: a trial may
// probe at once, a plain request may not.
func markDown(t *testing.T, th *adaptive.Throttle, clk *clock.Fake) {
	t.Helper()
	p, _ := th.Allow(false)
	p.Done(adaptive.Accept)
	clk.Advance(time.Second)
	th.Connectivity(false)
	p, _ = th.Allow(false)
	p.Done(adaptive.Overload)
	if !th.Down() {
		t.Fatal("dependency not down")
	}
	clk.Advance(time.Second)
}

// Only the first attempt of a trial's call may probe without the credit:
// a retry whose target went down during its backoff stays refused.
func TestTrialRetryIsNoProbe(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set := newAdaptive(t, clk, nil)
	cc := newCC(t)
	th := set.Get(normalizeTarget(cc.Target()))
	i := mustNew(t, WithAdaptive(set), withSleep(func(context.Context, time.Duration) error {
		markDown(t, th, clk) // during the backoff
		return nil
	}))
	f := &fakeInvoker{results: []error{errUnavailable, nil}}
	ctx := metadata.NewIncomingContext(ctxTimeout(t, time.Minute), metadata.Pairs(MetadataDepth, "1", MetadataTrial, "1"))
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/Tier"}
	_, err := i.UnaryServer()(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
		return nil, i.UnaryClient()(ctx, "/svc/M", nil, nil, cc, f.invoke)
	})
	if err == nil || len(f.seen) != 1 {
		t.Fatalf("retry of a trial's call into a target that went down: %d attempts, err %v; want 1 and an error", len(f.seen), err)
	}
}

// A stream's start holds no slot and shows nothing: if it is let in as
// the trial, it gives the turn back, and the unary request right after
// it goes in as the trial.
func TestStreamStartGivesTrialBack(t *testing.T) {
	admClk := clock.NewFake(time.Now().Add(-time.Hour))
	i := mustNew(t, WithAdmission(admission.Config{Window: time.Second, Clock: admClk}))
	l := i.Admission()
	overload(t, l, admClk)
	admClk.Advance(time.Hour)
	ss := &queueStream{ctx: ctxTimeout(t, time.Minute)}
	if err := i.StreamServer()(nil, ss, &grpc.StreamServerInfo{FullMethod: "/svc/S", IsServerStream: true}, func(any, grpc.ServerStream) error { return nil }); err != nil {
		t.Fatalf("stream start, a trial due: %v", err)
	}
	ran := false
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/Tier"}
	_, err := i.UnaryServer()(ctxTimeout(t, time.Minute), nil, info, func(ctx context.Context, _ any) (any, error) {
		in, _ := FromContext(ctx)
		ran = in.Trial
		return nil, nil
	})
	if err != nil || !ran {
		t.Fatalf("unary request right after a stream start: err %v, ran as a trial %v; want the trial", err, ran)
	}
	if l.Overloaded() {
		t.Error("still overloaded after the trial was served at once")
	}
}

// A trial refused only because the probe interval has not passed yet is
// held like any first attempt, and then asks again as a trial: the
// interval has passed meanwhile, and it goes out as the probe instead of
// failing.
func TestTrialAsksAgainAfterHold(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set, err := adaptive.NewSet(adaptive.Config{Clock: clk, Rand: func() float64 { return 0.5 }}, 0) // the default hold
	if err != nil {
		t.Fatal(err)
	}
	cc := newCC(t)
	th := set.Get(normalizeTarget(cc.Target()))
	markDown(t, th, clk)
	// A probe now, so that the next one must wait the interval.
	if p, err := th.AllowTrial(); err != nil {
		t.Fatal(err)
	} else {
		p.Done(adaptive.Overload)
	}
	held := 0
	i := mustNew(t, WithAdaptive(set), withHold(func(context.Context, time.Duration, <-chan struct{}) error {
		held++
		clk.Advance(time.Second) // the hold ends without the target back
		return nil
	}))
	dep := &fakeInvoker{results: []error{nil}}
	ctx := metadata.NewIncomingContext(ctxTimeout(t, time.Minute), metadata.Pairs(MetadataDepth, "1", MetadataTrial, "1"))
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/Tier"}
	_, err = i.UnaryServer()(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
		return nil, i.UnaryClient()(ctx, "/svc/M", nil, nil, cc, dep.invoke)
	})
	if held != 1 || err != nil || len(dep.seen) != 1 || th.Down() {
		t.Fatalf("trial within the probe interval: held %d, err %v, attempts %d, down %v; want held once, then the probe answered", held, err, len(dep.seen), th.Down())
	}
}
