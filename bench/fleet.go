package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health" // also registers the client-side health checker
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/loadgen"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// FleetParams sizes the fleet scenario of issue 13: Replicas replicas of
// order, each with its own connection to payment and its own client
// interceptors (interceptor.Recommended), share an open-loop load of Rate
// user requests per second, each sent to a replica drawn at random with
// a deadline of Deadline. Payment is healthy for Healthy, answers every
// call UNAVAILABLE on its own for For (alive, its connections ready),
// then is healthy again for After. Health turns on client-side health
// checking (interceptor.HealthServiceConfig); payment runs
// interceptor.WithHealth in both modes.
type FleetParams struct {
	Replicas int
	Health   bool
	Rate     int
	Healthy  time.Duration
	For      time.Duration
	After    time.Duration
	Deadline time.Duration
	Fine     time.Duration // the slices of payment's counts and of the recovery
	Seed     uint64
}

// DefaultFleetParams are the sizes of the fleet-grpc scenario, for one
// replica count and mode.
var DefaultFleetParams = FleetParams{
	Replicas: 100,
	Rate:     1000,
	Healthy:  2500 * time.Millisecond,
	For:      4 * time.Second,
	After:    3 * time.Second,
	Deadline: time.Second,
	Fine:     50 * time.Millisecond,
	Seed:     1,
}

// Fleet is the result of one fleet run.
type Fleet struct {
	Params  FleetParams
	Samples Samples // every user request, by start since the start of the load
	// Payment holds the calls that reached payment's handler, by arrival
	// in slices of Params.Fine since the start of the load.
	Payment    []int64
	Begin, End time.Duration
	// Downs is how many times payment said NOT_SERVING during the load;
	// DownsAfterBack how many of them after payment was back.
	Downs, DownsAfterBack int64
	// Retries is how many of payment's calls while down were retries;
	// WhileNotServing how many arrived while it said NOT_SERVING.
	Retries, WhileNotServing int64
	// Changes are payment's health reports during the load, in order.
	Changes []HealthChange
	// Attempts is, per replica, the calls one at a time after the load
	// (each after its channel is ready, at most fleetCheckAttempts) until
	// the first success; 0 when none succeeded.
	Attempts []int
}

// Calls returns the calls at payment that arrived in [from, to) and the
// user requests that started in it.
func (f Fleet) Calls(from, to time.Duration) (calls int64, requests int) {
	for i, n := range f.Payment {
		if at := time.Duration(i) * f.Params.Fine; at >= from && at < to {
			calls += n
		}
	}
	return calls, len(f.Samples.Between(from, to))
}

// PerRequest returns the calls at payment per user request in [from, to).
func (f Fleet) PerRequest(from, to time.Duration) float64 {
	c, r := f.Calls(from, to)
	if r == 0 {
		return 0
	}
	return float64(c) / float64(r)
}

// Floor returns the replicas per user request of the outage: the calls
// per request of a fleet in which each replica learns of the outage with
// exactly one call.
func (f Fleet) Floor() float64 {
	_, r := f.Calls(f.Begin, f.End)
	if r == 0 {
		return 0
	}
	return float64(f.Params.Replicas) / float64(r)
}

// Recovery returns the time from payment's return to the end of the last
// slice of Params.Fine (by request start) with less than 99 % success;
// ok is false when the load ended before that.
func (f Fleet) Recovery() (time.Duration, bool) {
	return f.Samples.Recovery(f.End, f.End+f.Params.After, f.Params.Fine)
}

// HealthChange is one report of payment's health: at, since the start of
// the load, it said SERVING or NOT_SERVING.
type HealthChange struct {
	At      time.Duration
	Serving bool
}

// healthLog records payment's health reports (an interceptor.Observer).
type healthLog struct {
	start atomic.Int64 // unix ns of the load's start; 0 before
	mu    sync.Mutex
	log   []HealthChange
}

func (l *healthLog) Observe(_ context.Context, e interceptor.Event) {
	s := l.start.Load()
	if s == 0 || (e.Kind != interceptor.EventServing && e.Kind != interceptor.EventNotServing) {
		return
	}
	at := time.Duration(time.Now().UnixNano() - s)
	l.mu.Lock()
	l.log = append(l.log, HealthChange{At: at, Serving: e.Kind == interceptor.EventServing})
	l.mu.Unlock()
}

// Trials returns the trials that ended during the outage and their mean
// length, from a SERVING report to the next NOT_SERVING.
func (f Fleet) Trials() (n int, mean time.Duration) {
	var sum time.Duration
	for i := 1; i < len(f.Changes); i++ {
		a, b := f.Changes[i-1], f.Changes[i]
		if a.Serving && !b.Serving && a.At >= f.Begin && b.At < f.End {
			n++
			sum += b.At - a.At
		}
	}
	if n == 0 {
		return 0, 0
	}
	return n, sum / time.Duration(n)
}

// fleetCheckAttempts bounds the calls of each replica after the load.
const fleetCheckAttempts = 5

// payment is the fleet's payment service: it counts every call that
// reaches its handler and fails them all on its own while down.
type payment struct {
	testsvcv1.UnimplementedTestServiceServer
	down  atomic.Bool
	start atomic.Int64 // unix ns of the load's start; 0 before
	fine  time.Duration
	calls []atomic.Int64
	total atomic.Int64

	serving *admission.Serving // payment's own, set before it serves
	// Of the calls while down: retries (x-retry-attempt set),
	// and calls that arrived while payment said NOT_SERVING (sent by a
	// client not yet told, or not watching).
	retries, unwatched atomic.Int64
}

func (p *payment) Unary(ctx context.Context, _ *testsvcv1.UnaryRequest) (*testsvcv1.UnaryResponse, error) {
	p.total.Add(1)
	if s := p.start.Load(); s != 0 {
		if i := int(time.Duration(time.Now().UnixNano()-s) / p.fine); i >= 0 && i < len(p.calls) {
			p.calls[i].Add(1)
		}
	}
	if p.down.Load() {
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(interceptor.MetadataAttempt)) > 0 {
			p.retries.Add(1)
		}
		if p.serving != nil && !p.serving.Serving() {
			p.unwatched.Add(1)
		}
		return nil, status.Error(codes.Unavailable, "payment: its database is down")
	}
	return &testsvcv1.UnaryResponse{}, nil
}

// replica is one replica of order: its own connection to payment and its
// own client interceptors.
type replica struct {
	cc *grpc.ClientConn
	cl testsvcv1.TestServiceClient
}

// RunFleet runs the fleet scenario once.
func RunFleet(fp FleetParams) (Fleet, error) {
	if fp.Replicas < 1 || fp.Rate < 1 || fp.Fine <= 0 || fp.Deadline <= 0 {
		return Fleet{}, fmt.Errorf("RunFleet: invalid params %+v", fp)
	}
	total := fp.Healthy + fp.For + fp.After
	pay := &payment{fine: fp.Fine, calls: make([]atomic.Int64, int(total/fp.Fine)+int(fp.Deadline/fp.Fine)+2)}
	hs := health.NewServer()
	hl := &healthLog{}
	srvI, err := interceptor.New(append(interceptor.Recommended(), interceptor.WithHealth(hs, admission.ServingConfig{}), interceptor.WithObserver(hl))...)
	if err != nil {
		return Fleet{}, err
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(srvI.ServerOptions()...)
	pay.serving = srvI.Serving()
	testsvcv1.RegisterTestServiceServer(srv, pay)
	healthpb.RegisterHealthServer(srv, hs)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	defer func() {
		srv.Stop()
		<-served
	}()

	reps := make([]replica, 0, fp.Replicas)
	defer func() {
		for _, r := range reps {
			_ = r.cc.Close()
		}
	}()
	for range fp.Replicas {
		cliI, err := interceptor.New(interceptor.Recommended()...)
		if err != nil {
			return Fleet{}, err
		}
		opts := append([]grpc.DialOption{
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
		}, cliI.DialOptions()...)
		if fp.Health {
			opts = append(opts, grpc.WithDefaultServiceConfig(interceptor.HealthServiceConfig))
		}
		cc, err := grpc.NewClient("passthrough:///payment", opts...)
		if err != nil {
			return Fleet{}, err
		}
		reps = append(reps, replica{cc: cc, cl: testsvcv1.NewTestServiceClient(cc)})
	}
	// Warm: every replica connected and served once.
	for i, r := range reps {
		if err := waitReady(r.cc, 10*time.Second); err != nil {
			return Fleet{}, fmt.Errorf("replica %d: %w", i, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), fp.Deadline)
		_, err := r.cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: "warm"})
		cancel()
		if err != nil {
			return Fleet{}, fmt.Errorf("replica %d warm-up: %w", i, err)
		}
	}

	res := Fleet{Params: fp, Begin: fp.Healthy, End: fp.Healthy + fp.For}
	serving := srvI.Serving()
	downs0 := serving.Downs()
	var downsAtEnd int64
	res.Samples = fleetLoad(reps, fp, pay, hl, total, []loadgen.Step{
		{At: res.Begin, Do: func() { pay.down.Store(true) }},
		{At: res.End, Do: func() { pay.down.Store(false); downsAtEnd = serving.Downs() }},
	})
	res.Downs = serving.Downs() - downs0
	res.DownsAfterBack = serving.Downs() - downsAtEnd
	hl.mu.Lock()
	res.Changes = append([]HealthChange(nil), hl.log...)
	hl.mu.Unlock()
	res.Retries, res.WhileNotServing = pay.retries.Load(), pay.unwatched.Load()
	res.Payment = make([]int64, len(pay.calls))
	for i := range pay.calls {
		res.Payment[i] = pay.calls[i].Load()
	}
	res.Attempts = make([]int, len(reps))
	for i, r := range reps {
		res.Attempts[i] = firstSuccess(r, fp.Deadline)
	}
	return res, nil
}

// fleetLoad sends the open-loop load, each request to a replica drawn at
// random (seeded), and takes the steps; it returns when every request
// has ended.
func fleetLoad(reps []replica, fp FleetParams, pay *payment, hl *healthLog, total time.Duration, steps []loadgen.Step) Samples {
	rng := rand.New(rand.NewPCG(fp.Seed, uint64(len(reps))))
	interval := time.Second / time.Duration(fp.Rate)
	var (
		mu  sync.Mutex
		out Samples
		wg  sync.WaitGroup
	)
	start := time.Now()
	pay.start.Store(start.UnixNano())
	hl.start.Store(start.UnixNano())
	tick := time.NewTicker(interval)
	defer tick.Stop()
	sent, step := 0, 0
	for {
		elapsed := time.Since(start)
		if elapsed >= total {
			break
		}
		for step < len(steps) && elapsed >= steps[step].At {
			steps[step].Do()
			step++
		}
		// Arrivals are due from the start, not from the last tick: a
		// late tick sends what it owes at once.
		for due := int(elapsed/interval) + 1; sent < due; sent++ {
			r := reps[rng.IntN(len(reps))]
			id := strconv.Itoa(sent)
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), fp.Deadline)
				begin := time.Now()
				_, err := r.cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: id})
				lat := time.Since(begin)
				cancel()
				mu.Lock()
				out = append(out, Sample{Start: begin.Sub(start), Latency: lat, Code: status.Code(err)})
				mu.Unlock()
			})
		}
		<-tick.C
	}
	wg.Wait()
	return out
}

// firstSuccess calls r one call at a time, each once its channel is
// ready, and returns the number of the first call that succeeded, or 0.
func firstSuccess(r replica, deadline time.Duration) int {
	for n := 1; n <= fleetCheckAttempts; n++ {
		if waitReady(r.cc, 5*time.Second) != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		_, err := r.cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: "check"})
		cancel()
		if err == nil {
			return n
		}
	}
	return 0
}

var errNotReady = errors.New("channel not ready")

// waitReady waits, at most d, until cc is READY.
func waitReady(cc *grpc.ClientConn, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		cc.Connect()
		if !cc.WaitForStateChange(ctx, s) {
			return fmt.Errorf("%w: %v after %v", errNotReady, s, d)
		}
	}
	return nil
}
