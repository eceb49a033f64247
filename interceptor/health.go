package interceptor

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/admission"
)

// HealthServiceConfig is the client's service config that turns on gRPC
// client-side health checking of the whole server (service ""), for the
// server side of WithHealth. It selects the round_robin balancer: gRPC's
// default, pick_first, does no health checking (gRFC A17).
//
//	import _ "google.golang.org/grpc/health" // registers the health checker
//
//	conn, err := grpc.NewClient(target,
//		grpc.WithDefaultServiceConfig(interceptor.HealthServiceConfig), ...)
//
// Each connection then keeps one Watch stream open to the server's
// grpc.health.v1.Health service, and is ready only while the server
// reports SERVING. Merge the healthCheckConfig entry into your own
// service config if you have one (a default service config replaces, it
// does not merge).
const HealthServiceConfig = `{"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": ""}}`

// HealthSetter receives the server's serving status: grpc-go's
// *health.Server (google.golang.org/grpc/health) satisfies it.
type HealthSetter interface {
	SetServingStatus(service string, status healthpb.HealthCheckResponse_ServingStatus)
}

// WithHealth reports, through h, whether this server can serve at all,
// judged from its own answers (see admission.Serving): NOT_SERVING after a
// run of its own transient failures (by default 20 in a row, with nothing
// served for 50 ms; more after a partial loss, see admission.Serving),
// and SERVING again on trial after cfg.Trial (200 ms): only a trial
// brings it back, since answers served while it is not serving come from
// clients that do not watch its health and say little of whether it
// serves enough. Server side. Services are the health service names set
// (none: "", the whole server); each is SERVING from the start.
//
// It is for a server that is alive but cannot serve (its database is
// down): its connections stay ready, so each client must otherwise make a
// call to learn anything, and a fleet of quiet clients sends it about one
// call per client, retries included (issue 13's fleet). With client-side
// health checking (HealthServiceConfig) every client's channel leaves
// READY within a round trip of NOT_SERVING, its calls fail at once
// without reaching the server, and the adaptive throttle (WithAdaptive)
// marks the target down on the first of them; SERVING makes the channels
// ready again and revives the throttles, so every client sees the server
// back within one trial, whatever its own request rate. A failed trial
// costs cfg.TrialFailures calls plus the clients' traffic while its two
// changes of state reach every client (a few milliseconds for tens of
// clients; 25-50 ms for 1 000 watch streams on two shared cores, where
// it came to 0.25 calls per request, BENCHMARKS.md "Fleet over gRPC"). With several backends
// behind one target the balancer sends nothing to the backend that is not
// serving and the others carry the load.
//
// The health service's own calls (grpc.health.v1.Health: the clients'
// Watch streams, probes' Check calls) bypass the server interceptors
// altogether: they would count as served answers, and admission control
// would refuse a client's Watch when the server is full, which grpc-go's
// health client takes for NOT_SERVING for a second.
//
// What counts: an answer is served unless it has one of the retryable
// codes (WithCodes; UNAVAILABLE by default); such a failure counts
// against the server only when it is the handler's own, not one passed up
// from a call that gave up further down the chain (that server reports
// its own health). Requests refused by admission control, answers after
// the caller left, and panics count for nothing; during a trial, neither
// do the failures of requests that started before it.
//
// It judges the server as a whole, as the adaptive throttle judges a
// target (without WithPerMethodKeys): a server whose busy method fails
// alone (its own backend is down) while a quiet one still works goes
// NOT_SERVING for both, and the quiet method is served only during
// trials. Do not use WithHealth on a server whose methods depend on
// different backends that fail apart; use WithPerMethodKeys on its
// clients instead.
//
// Services are the health service names whose status WithHealth sets;
// "" (the whole server, what HealthServiceConfig watches) is always one
// of them. WithHealth owns their status from New on: New sets each to
// the tracker's state, SERVING for a new one, but leaves a status that
// h already reports NOT_SERVING (if h can say: grpc-go's health server
// can), so that a server kept out of rotation until it is warm stays out
// until its owner sets SERVING. Later, each change of the tracker's
// state and each trial sets every service's status, whatever an operator
// set meanwhile: to drain the server for good, call the health server's
// Shutdown, which ignores later updates (Resume undoes it). The tracker's
// state (Serving, and stormotel's stormguard.health.serving gauge) does
// not see what an operator set.
//
// h is usually the *health.Server registered on the same grpc.Server:
//
//	hs := health.NewServer()
//	sg, err := interceptor.New(append(interceptor.Recommended(),
//		interceptor.WithHealth(hs, admission.ServingConfig{}))...)
//	srv := grpc.NewServer(sg.ServerOptions()...)
//	healthpb.RegisterHealthServer(srv, hs)
//
// The trials run on the system clock (time.AfterFunc): cfg.Clock must be
// nil. An invalid cfg or a nil h (a nil *health.Server too) makes New
// fail.
func WithHealth(h HealthSetter, cfg admission.ServingConfig, services ...string) Option {
	var s *admission.Serving
	err := error(nil)
	if cfg.Clock != nil {
		err = invalid("WithHealth: ServingConfig.Clock must be nil: the trials run on timers")
	} else if isNil(h) {
		err = invalid("WithHealth: nil HealthSetter")
	} else if s, err = admission.NewServing(cfg); err != nil {
		err = invalid("WithHealth: %v", err)
	}
	if !slices.Contains(services, "") {
		services = append([]string{""}, services...)
	}
	sh := &selfHealth{serving: s, h: h, services: services, after: afterFunc}
	return setupOption("WithHealth", func(c *config) error {
		if err != nil {
			return err
		}
		c.health = sh
		// A health server knows only "" until told: a client that
		// watches another of the services would see it unknown, and its
		// channel never ready, until the first change.
		sh.setInitial()
		return nil
	})
}

// isNil reports whether v is nil, or a nil pointer or func in an
// interface (a typed nil), whose methods would panic at the first call.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Func:
		return rv.IsNil()
	}
	return false
}

// Serving returns the server's health tracker (WithHealth), or nil, to
// read its state (Serving, Downs). The interceptor records every answer
// of the server itself: do not call Record or Trial on it, since a change
// made there is neither published nor followed by a trial.
func (i *Interceptors) Serving() *admission.Serving {
	if i.server.health == nil {
		return nil
	}
	return i.server.health.serving
}

// selfHealth reports the server's Serving state to a HealthSetter.
type selfHealth struct {
	serving  *admission.Serving
	h        HealthSetter
	services []string

	// after runs f after d: time.AfterFunc; tests take the trial in hand.
	after func(d time.Duration, f func())

	mu       sync.Mutex // orders the reports; guards pending and observer
	pending  bool       // a trial timer is set
	observer Observer   // New's; the last New given one wins
}

func afterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }

func (sh *selfHealth) setObserver(o Observer) {
	sh.mu.Lock()
	sh.observer = o
	sh.mu.Unlock()
}

// admit lets every request run (the server's health is for its callers'
// balancers to read, not a gate) and notes the Serving's epoch (the
// trials started) it starts in, so that its failure does not count
// against a trial that started after it.
func (sh *selfHealth) admit(_ *server, sc *stateCtx, _ string, _ grpc.ServerStream) error {
	sc.st.epoch = sh.serving.Epoch()
	return nil
}

// done records the handler's answer (a panic or a request not run is
// none).
func (sh *selfHealth) done(s *server, sc *stateCtx, err error) {
	if err != errPanicked && err != errNotRun {
		sh.record(sc, err, s.retryable)
	}
}

// record reports an answer of the handler: see WithHealth for what
// counts.
func (sh *selfHealth) record(sc *stateCtx, err error, retryable uint64) {
	if sh == nil || sc.Err() != nil {
		return
	}
	served := err == nil || retryable&codeBit(status.Code(err)) == 0
	if !served && sc.st.gaveUp.Load() {
		return // passed up from further down
	}
	if sh.serving.RecordFrom(sc.st.epoch, served) {
		sh.publish(served)
	}
}

// healthPrefix begins the full method names of the gRPC health service.
var healthPrefix = "/" + healthpb.Health_ServiceDesc.ServiceName + "/"

// healthMethod reports whether method is one of the gRPC health service's.
func healthMethod(method string) bool { return strings.HasPrefix(method, healthPrefix) }

// healthChecker reads a service's status: grpc-go's *health.Server
// satisfies it.
type healthChecker interface {
	Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error)
}

// setInitial sets every service's status to the current state, except
// that a service that h already says is NOT_SERVING stays so while the
// state is SERVING: a server kept out until it is warm (its status set
// before New, and set to SERVING by its owner when ready) would
// otherwise take calls it cannot serve yet from New on.
func (sh *selfHealth) setInitial() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !sh.serving.Serving() {
		sh.setLocked()
		return
	}
	hc, _ := sh.h.(healthChecker)
	for _, svc := range sh.services {
		if hc != nil {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING {
				continue
			}
		}
		sh.h.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
}

// setLocked sets every service's status to the current state; a server
// that is not serving gets a timer for its trial. sh.mu is held.
func (sh *selfHealth) setLocked() {
	st := healthpb.HealthCheckResponse_SERVING
	if !sh.serving.Serving() {
		st = healthpb.HealthCheckResponse_NOT_SERVING
		sh.armLocked()
	}
	for _, svc := range sh.services {
		sh.h.SetServingStatus(svc, st)
	}
}

// publish reports the current state to h, under mu so that reports made
// concurrently land in order; the last one is always the current state.
// A server that is not serving gets a timer for its trial. changedTo is
// the state the change that calls it made, for the event: each change
// reports its own, even if another one followed it at once.
func (sh *selfHealth) publish(changedTo bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	kind := EventServing
	if !changedTo {
		kind = EventNotServing
	}
	sh.setLocked()
	if sh.observer != nil {
		sh.observer.Observe(context.Background(), Event{Kind: kind})
	}
}

// trial runs when a trial may be due: it starts it, or waits again if the
// server stopped serving anew since the timer was set.
func (sh *selfHealth) trial() {
	sh.mu.Lock()
	sh.pending = false
	sh.mu.Unlock()
	if sh.serving.Trial() {
		sh.publish(true)
		return
	}
	if !sh.serving.Serving() {
		sh.mu.Lock()
		sh.armLocked()
		sh.mu.Unlock()
	}
}

// armLocked sets the trial timer unless one is set. sh.mu is held.
func (sh *selfHealth) armLocked() {
	if !sh.pending {
		sh.pending = true
		sh.after(max(sh.serving.TrialIn(), time.Millisecond), sh.trial)
	}
}
