package interceptor

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/admission"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Review of the health commits, finding 1: a probe (a kubelet gRPC probe,
// grpc_health_probe) calling Health/Check over gRPC while the server is
// not serving must not make it serving: before, the Check call counted
// as a served answer.
func TestHealthCheckCallDoesNotRevive(t *testing.T) {
	svc, sick := sickableStub()
	r := startHealthRig(t, svc, admission.ServingConfig{MinFailures: 4, Quiet: 3 * time.Millisecond, Trial: time.Hour})
	if err := r.call(t); err != nil {
		t.Fatal(err)
	}
	sick.Store(true)
	for n := 0; r.status(t) == healthpb.HealthCheckResponse_SERVING; n++ {
		if n == 10 {
			t.Fatal("still SERVING after 10 failing calls")
		}
		_ = r.call(t)
	}
	probe := dialBufconn(t, r.lis, "payment")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(probe).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING || r.status(t) != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("after a Health/Check call: answered %v, now %v; want NOT_SERVING", resp.GetStatus(), r.status(t))
	}
}

// Review finding 2: with admission control full as a client connects, its
// health Watch stream must not be refused (grpc-go's health client would
// take the SERVING server for not serving for a second).
func TestAdmissionLetsHealthWatchThrough(t *testing.T) {
	hs := health.NewServer()
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	svc := &stubService{unary: func(int, context.Context) error {
		started <- struct{}{}
		<-release
		return nil
	}}
	srvI := mustNew(t, WithAdmission(admission.Config{MaxInFlight: 1}),
		WithHealth(hs, admission.ServingConfig{}))
	srv := grpc.NewServer(srvI.ServerOptions()...)
	testsvcv1.RegisterTestServiceServer(srv, svc)
	healthpb.RegisterHealthServer(srv, hs)
	lis := serveBufconn(t, srv)
	busy := dialBufconn(t, lis, "payment")
	cc := dialBufconn(t, lis, "payment", grpc.WithDefaultServiceConfig(HealthServiceConfig))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	busyDone := make(chan struct{})
	go func() {
		defer close(busyDone)
		_, _ = testsvcv1.NewTestServiceClient(busy).Unary(ctx, &testsvcv1.UnaryRequest{Id: "x"})
	}()
	<-started // the one slot is taken
	cc.Connect()
	s := cc.GetState()
	for s != connectivity.Ready && s != connectivity.TransientFailure {
		if !cc.WaitForStateChange(ctx, s) {
			t.Fatal("no state change")
		}
		s = cc.GetState()
	}
	close(release)
	<-busyDone
	if s != connectivity.Ready {
		t.Fatalf("channel to a SERVING server is %v: its health Watch was refused", s)
	}
}

// Review finding 5: WithHealth always sets "" (what HealthServiceConfig
// watches), also when given service names.
func TestHealthAlwaysSetsWholeServer(t *testing.T) {
	hs := health.NewServer()
	i := mustNew(t, WithHealth(hs, admission.ServingConfig{}, "payment.v1.Payment"))
	if got := i.server.health.services; len(got) != 2 || got[0] != "" || got[1] != "payment.v1.Payment" {
		t.Fatalf("services %q, want [\"\" payment.v1.Payment]", got)
	}
	i.server.health.after = (&trials{}).after
	i.server.health.publish(false) // as at a change to not serving
	for _, svc := range []string{"", "payment.v1.Payment"} {
		resp, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			// Serving() is still true: publish reports the current state.
			t.Fatalf("%q: %v %v", svc, resp.GetStatus(), err)
		}
	}
}

// Review finding 7: an idle channel says nothing when a down target is
// asked to admit a call: before, it counted as broken, and the next READY
// (the channel reconnecting for a probe) revived a target that was alive
// but failing, after every idle timeout.
func TestAdaptiveIdleChannelDoesNotRevive(t *testing.T) {
	cfg, th := acceptedPayment(t)
	for !th.Down() { // failures behind a ready channel
		p, err := th.Allow(false)
		if err != nil {
			t.Fatal(err)
		}
		p.Done(adaptive.Overload)
	}
	conn := &fakeConn{state: connectivity.Idle}
	admit := func() error {
		c := &call{}
		c.init(ctxTimeout(t, time.Minute), &cfg, "payment", "/svc/M")
		c.conn = conn
		var a attempt
		err := c.begin(&a)
		a.thr.Done(adaptive.Ignored)
		return err
	}
	if err := admit(); !errors.Is(err, adaptive.ErrThrottled) {
		t.Fatalf("idle channel: %v, want refused", err)
	}
	conn.state = connectivity.Ready
	if err := admit(); !errors.Is(err, adaptive.ErrThrottled) || !th.Down() {
		t.Fatalf("ready again after idle: %v, down %v; want refused, still down", err, th.Down())
	}
}

// The regressions of the review of 2026-12-05.

// A service named in WithHealth besides "" is SERVING from the start: a
// health server knows only "" until told, and a client whose health
// check names the service would see it unknown, its channel never ready,
// on a healthy server.
func TestHealthNamedServiceServingFromStart(t *testing.T) {
	hs := health.NewServer()
	srvI := mustNew(t, WithHealth(hs, admission.ServingConfig{}, "payment.v1.Payment"))
	resp, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "payment.v1.Payment"})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("named service of a healthy server: %v, %v; want SERVING", resp.GetStatus(), err)
	}
	srv := grpc.NewServer(srvI.ServerOptions()...)
	testsvcv1.RegisterTestServiceServer(srv, &stubService{unary: func(int, context.Context) error { return nil }})
	healthpb.RegisterHealthServer(srv, hs)
	lis := serveBufconn(t, srv)
	cc := dialBufconn(t, lis, "payment", grpc.WithDefaultServiceConfig(
		`{"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": "payment.v1.Payment"}}`))
	cc.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			t.Fatalf("channel watching the named service of a healthy server: %v, want READY", s)
		}
	}
}

// A nil *health.Server in the HealthSetter interface is refused by New,
// not a panic inside the first request that changes the state.
func TestHealthTypedNilSetter(t *testing.T) {
	var hs *health.Server
	if _, err := New(WithHealth(hs, admission.ServingConfig{})); err == nil {
		t.Fatal("New with a nil *health.Server: no error")
	}
}

// A server kept out of rotation until it is warm (its health set to
// NOT_SERVING before New) stays out until its owner sets SERVING: New set
// every service SERVING, and in a user's trial each cold replica took
// 67-115 calls it failed. A service that h does not know yet, or knows as
// SERVING, is SERVING from New on, as before.
func TestHealthKeepsWarmUpGate(t *testing.T) {
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus("gated", healthpb.HealthCheckResponse_NOT_SERVING)
	mustNew(t, WithHealth(hs, admission.ServingConfig{}, "gated", "payment"))
	status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("Check(%q): %v", svc, err)
		}
		return r.GetStatus()
	}
	for svc, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{
		"":        healthpb.HealthCheckResponse_NOT_SERVING,
		"gated":   healthpb.HealthCheckResponse_NOT_SERVING,
		"payment": healthpb.HealthCheckResponse_SERVING,
	} {
		if got := status(svc); got != want {
			t.Errorf("service %q after New: %v, want %v", svc, got, want)
		}
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING) // warm
	if got := status(""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("after the owner's SERVING: %v", got)
	}
}
