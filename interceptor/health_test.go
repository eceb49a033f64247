package interceptor

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// trials holds the health trial timers a test fires by hand.
type trials struct {
	mu sync.Mutex
	fs []func()
}

func (tr *trials) after(_ time.Duration, f func()) {
	tr.mu.Lock()
	tr.fs = append(tr.fs, f)
	tr.mu.Unlock()
}

// fire runs the pending trial timers and reports how many there were.
func (tr *trials) fire() int {
	tr.mu.Lock()
	fs := tr.fs
	tr.fs = nil
	tr.mu.Unlock()
	for _, f := range fs {
		f()
	}
	return len(fs)
}

// healthRig is a payment server with WithHealth and a health service, and
// a client with health checking and the adaptive throttle.
type healthRig struct {
	svc    *stubService
	hs     *health.Server
	srvI   *Interceptors
	trials *trials
	cc     *grpc.ClientConn
	cl     testsvcv1.TestServiceClient
	thr    func() *adaptive.Throttle
	events *recorder
	clk    *clock.Fake // the Serving's
	lis    *bufconn.Listener
}

// sickableStub returns a stub payment that answers UNAVAILABLE on its own
// while sick is set.
func sickableStub() (*stubService, *atomic.Bool) {
	sick := &atomic.Bool{}
	return &stubService{unary: func(int, context.Context) error {
		if sick.Load() {
			return errStubDown
		}
		return nil
	}}, sick
}

func startHealthRig(t *testing.T, svc *stubService, cfg admission.ServingConfig) *healthRig {
	t.Helper()
	r := &healthRig{svc: svc, hs: health.NewServer(), trials: &trials{}, events: &recorder{}}
	r.srvI = mustNew(t, WithHealth(r.hs, cfg), WithObserver(r.events))
	// The same tracker on a fake clock, and the trial timers in hand.
	r.clk = clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg.Clock = r.clk
	s, err := admission.NewServing(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.srvI.server.health.serving = s
	r.srvI.server.health.after = r.trials.after
	srv := grpc.NewServer(r.srvI.ServerOptions()...)
	inner := svc.unary
	svc.unary = func(n int, ctx context.Context) error {
		r.clk.Advance(time.Millisecond) // each answer 1 ms after the last
		return inner(n, ctx)
	}
	testsvcv1.RegisterTestServiceServer(srv, svc)
	healthpb.RegisterHealthServer(srv, r.hs)
	r.lis = serveBufconn(t, srv)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	set := newAdaptive(t, clk, nil)
	cc := dialBufconn(t, r.lis, "payment", append(mustNew(t, noWait, WithAdaptive(set), WithMaxAttempts(2)).DialOptions(),
		grpc.WithDefaultServiceConfig(HealthServiceConfig))...)
	r.cc, r.cl = cc, testsvcv1.NewTestServiceClient(cc)
	r.thr = func() *adaptive.Throttle { return set.Get("payment") }
	return r
}

func (r *healthRig) call(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := r.cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: "x"})
	return err
}

// waitState waits until the channel is in want, for at most 5 s.
func (r *healthRig) waitState(t *testing.T, want connectivity.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for s := r.cc.GetState(); s != want; s = r.cc.GetState() {
		if !r.cc.WaitForStateChange(ctx, s) {
			t.Fatalf("channel still %v, want %v", s, want)
		}
	}
}

func (r *healthRig) status(t *testing.T) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := r.hs.Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetStatus()
}

// A server that fails everything on its own says NOT_SERVING; its
// client's channel leaves READY, calls fail without reaching it and the
// throttle is down; a trial that is served makes it SERVING, the channel
// READY and the throttle up, with no probe.
func TestHealthOverGRPC(t *testing.T) {
	svc, sick := sickableStub()
	r := startHealthRig(t, svc, admission.ServingConfig{MinFailures: 4, Quiet: 3 * time.Millisecond, Trial: 100 * time.Millisecond})
	if err := r.call(t); err != nil {
		t.Fatalf("healthy call: %v", err)
	}
	r.waitState(t, connectivity.Ready)

	sick.Store(true)
	for n := 0; r.status(t) == healthpb.HealthCheckResponse_SERVING; n++ {
		if n == 4 {
			t.Fatal("still SERVING after 4 failing calls")
		}
		if err := r.call(t); status.Code(err) != codes.Unavailable {
			t.Fatalf("sick call: %v", err)
		}
	}
	reached := svc.calls.Load()
	r.waitState(t, connectivity.TransientFailure)
	// Not ready: the call fails at once, payment sees nothing, and the
	// throttle marks payment down on that one failure.
	if err := r.call(t); status.Code(err) != codes.Unavailable {
		t.Fatalf("call while not serving: %v", err)
	}
	if got := svc.calls.Load(); got != reached {
		t.Fatalf("payment handled %d calls while not serving", got-reached)
	}
	if !r.thr().Down() {
		t.Fatal("throttle not down after a failure on a channel that is not ready")
	}

	// A timer that fires early starts no trial; a trial while still
	// sick: NOT_SERVING again after TrialFailures (2).
	if r.trials.fire() != 1 || r.status(t) != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatal("no trial timer set, or a trial before Trial had passed")
	}
	r.clk.Advance(100 * time.Millisecond)
	if r.trials.fire() != 1 {
		t.Fatal("no trial timer set again after an early one")
	}
	if r.status(t) != healthpb.HealthCheckResponse_SERVING {
		t.Fatal("not SERVING on trial")
	}
	r.waitState(t, connectivity.Ready)
	for n := 0; r.status(t) == healthpb.HealthCheckResponse_SERVING; n++ {
		if n == 2 {
			t.Fatal("trial not ended by 2 failures")
		}
		_ = r.call(t) // revives the throttle (ready channel), then fails
	}

	// Payment is back; the next trial is served.
	sick.Store(false)
	r.waitState(t, connectivity.TransientFailure)
	r.clk.Advance(100 * time.Millisecond)
	if r.trials.fire() != 1 {
		t.Fatal("no trial timer after the failed trial")
	}
	r.waitState(t, connectivity.Ready)
	if err := r.call(t); err != nil {
		t.Fatalf("call after payment is back: %v", err)
	}
	if st := r.thr().Stats(); st.Down || st.Probes != 0 {
		t.Fatalf("throttle after recovery: %+v, want up with no probe", st)
	}
	if r.status(t) != healthpb.HealthCheckResponse_SERVING || r.srvI.Serving().Downs() != 2 {
		t.Fatalf("status %v, downs %d; want SERVING, 2", r.status(t), r.srvI.Serving().Downs())
	}
	if got := r.events.count(EventNotServing); got != 2 {
		t.Errorf("%d not_serving events, want 2", got)
	}
	if got := r.events.count(EventServing); got != 2 {
		t.Errorf("%d serving events, want 2 (two trials)", got)
	}
}

// Application errors are served answers; failures passed up from a call
// that gave up further down, answers after the caller left, and
// admission refusals count for nothing.
func TestHealthCountsOnlyOwnFailures(t *testing.T) {
	sh := &selfHealth{h: health.NewServer(), services: []string{""}, after: (&trials{}).after}
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := admission.NewServing(admission.ServingConfig{MinFailures: 2, Quiet: time.Millisecond, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	sh.serving = s
	retryable := codeBit(codes.Unavailable)
	live := &stateCtx{Context: context.Background()}
	passedUp := &stateCtx{Context: context.Background()}
	passedUp.st.gaveUp.Store(true)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	left := &stateCtx{Context: gone}
	for range 10 {
		sh.record(live, status.Error(codes.NotFound, "no such order"), retryable)
		sh.record(passedUp, errStubDown, retryable)
		sh.record(left, errStubDown, retryable)
	}
	if !s.Serving() || s.Downs() != 0 {
		t.Fatal("not serving on answers that are not the server's own failures")
	}
	sh.record(live, errStubDown, retryable)
	clk.Advance(time.Millisecond)
	sh.record(live, errStubDown, retryable)
	if s.Serving() {
		t.Fatal("serving after two own failures in a row")
	}
	var nilHealth *selfHealth
	nilHealth.record(live, errStubDown, retryable) // WithHealth off: no panic
}

func TestWithHealthConfigErrors(t *testing.T) {
	hs := health.NewServer()
	for name, o := range map[string]Option{
		"nil setter": WithHealth(nil, admission.ServingConfig{}),
		"clock":      WithHealth(hs, admission.ServingConfig{Clock: clock.Real{}}),
		"bad config": WithHealth(hs, admission.ServingConfig{MinFailures: -1}),
	} {
		if _, err := New(o); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: New = %v, want ErrInvalidOption", name, err)
		}
	}
	i, err := New(WithHealth(hs, admission.ServingConfig{}, "payment.v1.Payment", ""))
	if err != nil || i.Serving() == nil {
		t.Fatalf("New = %v, Serving %v", err, i.Serving())
	}
	if i, _ := New(); i.Serving() != nil {
		t.Fatal("Serving without WithHealth")
	}
}
