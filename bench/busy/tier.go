package busy

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/stormguard/stormguard/bench"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// The lines a tier prints on stdout, in this order, once it serves: the
// URL of its counters (Counts as JSON), then its gRPC address. The
// address comes last, after the connection to the next tier is ready, so
// that a reader that has it can send at once.
const (
	lineStats = "stats "
	lineAddr  = "listening "
)

// connectParams make a lost connection to the next tier come back within
// tens of milliseconds (grpc-go's default backoff grows to 2 minutes).
var connectParams = grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay:  10 * time.Millisecond,
		Multiplier: 1.6,
		Jitter:     0.2,
		MaxDelay:   100 * time.Millisecond,
	},
	MinConnectTimeout: time.Second,
}

// tierFlags are the flags of one tier process.
type tierFlags struct {
	tier, stack   string
	listen, stats string
	next          []string
	cpu           time.Duration
	seed          uint64
	connect       time.Duration
	work          Work
}

func parseTierFlags(args []string, stderr io.Writer) (tierFlags, error) {
	var f tierFlags
	fs := flag.NewFlagSet("tier", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: tier --tier gateway|order|payment --stack NAME [--next ADDR[,ADDR...]] [work flags]\n\n"+
			"Serves one tier of the gateway -> order -> payment test chain over TCP on 127.0.0.1\n"+
			"with the bench stack NAME on its server and on its client to --next, and prints\n"+
			"  %sURL      (its counters as JSON)\n  %sADDR  (once the next tier is connected)\n"+
			"Each request's work (--fail-all, --fail, --wait, --workers/--hold, --cpu) runs behind\n"+
			"every interceptor of the stack, as a handler's would. The stats port also serves\n"+
			"GET /arrivals (calls per millisecond), POST /fail-all?on=1 (on=0 ends it) and\n"+
			"GET /debug/pprof/profile?seconds=N (a CPU profile of the tier under load), GET /debug/pprof/allocs (its allocations since it started).\n"+
			"Stop it with SIGTERM.\n\nFlags:\n", lineStats, lineAddr)
		fs.PrintDefaults()
	}
	fs.StringVar(&f.tier, "tier", "", "the tier: gateway, order or payment")
	fs.StringVar(&f.stack, "stack", "none", "the bench stack on this tier (bench.Stacks: none, recommended, recommended-health, ggm-retry, ...)")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:0", "loopback `address` to serve gRPC on (port 0: any free port)")
	fs.StringVar(&f.stats, "stats", "127.0.0.1:0", "loopback `address` to serve the counters on (HTTP, JSON)")
	next := fs.String("next", "", "`addresses` of the next tier, comma-separated (several: round_robin over them)")
	fs.DurationVar(&f.cpu, "cpu", 0, "burn `d` of CPU per request, calibrated at start (--cpu-units sets the units instead)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the random failures")
	fs.DurationVar(&f.connect, "connect-timeout", 10*time.Second, "how `long` to wait for the next tier to be ready")
	f.work.register(fs)
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *next != "" {
		f.next = strings.Split(*next, ",")
	}
	idx := slices.Index(testsvc.DefaultTiers, f.tier)
	last := len(testsvc.DefaultTiers) - 1
	switch {
	case idx < 0:
		return f, fmt.Errorf("--tier %q: want one of %v", f.tier, testsvc.DefaultTiers)
	case idx < last && len(f.next) == 0:
		return f, fmt.Errorf("--tier %s needs --next, the address of %s", f.tier, testsvc.DefaultTiers[idx+1])
	case idx == last && len(f.next) > 0:
		return f, fmt.Errorf("--tier %s is the last tier and takes no --next", f.tier)
	case f.cpu < 0:
		return f, fmt.Errorf("--cpu %v: want >= 0", f.cpu)
	case f.cpu > 0 && f.work.CPU > 0:
		return f, errors.New("--cpu and --cpu-units: give one")
	case f.connect <= 0:
		return f, fmt.Errorf("--connect-timeout %v: want > 0", f.connect)
	}
	for _, a := range append([]string{f.listen, f.stats}, f.next...) {
		if err := loopback(a); err != nil {
			return f, err
		}
	}
	return f, f.work.Validate()
}

// loopback reports an address that is not host:port on a loopback IP:
// the harness never listens on, or sends to, another interface.
func loopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("address %q: want a loopback IP such as 127.0.0.1", addr)
	}
	return nil
}

// findStack returns the bench stack called name.
func findStack(name string) (bench.Stack, error) {
	var names []string
	for _, s := range bench.AllStacks() {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return bench.Stack{}, fmt.Errorf("--stack %q: want one of %v", name, names)
}

// ServeTier runs one tier process (the tier command) until ctx ends:
// see the usage text of its flags. It prints the lines a harness reads
// on stdout and its log on stderr.
func ServeTier(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseTierFlags(args, stderr)
	if err != nil {
		return err
	}
	t, err := newTier(ctx, f)
	if err != nil {
		return err
	}
	defer t.close()
	t.log = stderr
	stopStats, statsURL, err := serveStats(f.stats, t)
	if err != nil {
		return err
	}
	defer stopStats()
	lis, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	fmt.Fprintf(stderr, "tier: %s (%s) on %s, next %v, work %+v\n", f.tier, f.stack, lis.Addr(), f.next, f.work)
	fmt.Fprintf(stdout, "%s%s\n%s%s\n", lineStats, statsURL, lineAddr, lis.Addr())
	return serveUntil(ctx, t.srv, lis)
}

// tier is one tier's server, its connection to the next tier and its
// counters.
type tier struct {
	name       string
	stormguard bool
	srv        *grpc.Server
	conn       *grpc.ClientConn // to the next tier; nil for payment
	svc        *testsvc.Tier    // counts what arrives
	sentTo     *testsvc.Tier    // counts the attempts sent to the next tier
	work       *worker
	obs        *counter
	arrivals   *arrivals // of the test service's unary calls
	log        io.Writer
}

// newTier builds the tier of f: the stack's instance, a connection to
// the next tier that is ready, and the server (not yet serving).
func newTier(ctx context.Context, f tierFlags) (*tier, error) {
	stack, err := findStack(f.stack)
	if err != nil {
		return nil, err
	}
	if f.cpu > 0 {
		if f.work.CPU, err = Calibrate(f.cpu); err != nil {
			return nil, err
		}
	}
	idx := slices.Index(testsvc.DefaultTiers, f.tier)
	t := &tier{name: f.tier, stormguard: stack.Stormguard, work: newWorker(f.work, f.seed), obs: new(counter), arrivals: newArrivals(), log: io.Discard}
	inst, err := stack.Instance(bench.InstanceOptions{
		Observer:   func(int) interceptor.Observer { return t.obs },
		RoundRobin: len(f.next) > 1,
	})
	if err != nil {
		return nil, err
	}
	cfg := inst.Config
	var next testsvcv1.TestServiceClient
	if len(f.next) > 0 {
		t.sentTo = testsvc.NewTier(testsvc.DefaultTiers[idx+1], nil, 0)
		if t.conn, err = dialNext(ctx, f.next, cfg.DialOptions, idx+1, f.connect, t.sentTo.CountingDialOptions()); err != nil {
			return nil, err
		}
		next = testsvcv1.NewTestServiceClient(t.conn)
	}
	t.svc = testsvc.NewTier(f.tier, next, f.seed)
	// Counting first (the arrivals series, then testsvc's admission, with
	// no faults set), then the stack's interceptors, then the work: where
	// a handler's would be.
	opts := append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(t.arrivals.unary)}, t.svc.AdmissionOptions()...)
	if cfg.ServerOptions != nil {
		opts = append(opts, cfg.ServerOptions(idx)...)
	}
	opts = append(opts, grpc.ChainUnaryInterceptor(t.work.unary))
	t.srv = grpc.NewServer(opts...)
	t.svc.Register(t.srv, t.sentTo)
	if cfg.Register != nil {
		cfg.Register(idx, t.srv)
	}
	return t, nil
}

// counts returns the tier's counters.
func (t *tier) counts() Counts {
	c := Counts{Tier: t.name, Stormguard: t.stormguard, Received: t.svc.Received(testsvc.Unary), Handled: t.work.handled.Load(), OK: t.work.ok.Load()}
	if t.sentTo != nil {
		c.Sent = t.sentTo.Attempts(testsvc.Unary)
	}
	t.obs.fill(&c)
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.CPU = ru.Utime.Nano() + ru.Stime.Nano()
	}
	return c
}

func (t *tier) close() {
	if t.conn != nil {
		_ = t.conn.Close()
	}
}

// serveUntil serves srv on lis until ctx ends; calls in flight then get
// a moment to finish, and are cut after it.
func serveUntil(ctx context.Context, srv *grpc.Server, lis net.Listener) error {
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		srv.Stop()
		<-stopped
	}
	<-done
	return nil
}

// dialNext connects to the next tier (round_robin over several
// addresses, through a resolver of fixed addresses) with the stack's
// dial options for hop, then extra, and waits until the connection is
// ready.
func dialNext(ctx context.Context, addrs []string, stackOpts func(int) []grpc.DialOption, hop int, wait time.Duration, extra []grpc.DialOption) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(connectParams),
	}
	if stackOpts != nil {
		opts = append(opts, stackOpts(hop)...)
	}
	opts = append(opts, extra...)
	target := "passthrough:///" + addrs[0]
	if len(addrs) > 1 {
		r := manual.NewBuilderWithScheme("busy")
		st := resolver.State{}
		for _, a := range addrs {
			st.Addresses = append(st.Addresses, resolver.Address{Addr: a})
		}
		r.InitialState(st)
		opts = append(opts, grpc.WithResolvers(r))
		target = r.Scheme() + ":///next"
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %v: %w", addrs, err)
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(wctx, s) {
			conn.Close()
			return nil, fmt.Errorf("next tier %v: not ready after %v (state %v)", addrs, wait, s)
		}
	}
	return conn, nil
}

// The stats port's paths, under the URL a tier prints (lineStats is
// its counts URL, pathCounts).
const (
	pathCounts   = "/counts"
	pathArrivals = "/arrivals"
	pathFailAll  = "/fail-all"
	pathSlow     = "/slow"
)

// FailAllState is the answer of a tier's POST /fail-all: its state and
// when it was switched (see worker.setFailAll for what the time means).
type FailAllState struct {
	FailAll bool      `json:"fail_all"`
	At      time.Time `json:"at"`
}

// SlowState is the answer of a tier's POST /slow: the share of slow
// requests it switched to (Work.Slow).
type SlowState struct {
	Share float64 `json:"share"`
}

// serveStats serves t's stats port on addr: GET /counts (Counts, JSON),
// GET /arrivals (Arrivals, JSON), POST /fail-all?on=1 (on=0 ends it:
// the tier answers every request UNAVAILABLE meanwhile, as with
// --fail-all; the answer is a FailAllState) and POST /slow?share=p (the
// share of slow requests, Work.Slow; the answer is a SlowState). It
// returns its stop function and the counts URL.
func serveStats(addr string, t *tier) (stop func(), url string, err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("stats: %w", err)
	}
	mux := http.NewServeMux()
	// A CPU profile of the tier under load: GET /debug/pprof/profile?seconds=N;
	// what it allocated since it started: GET /debug/pprof/allocs.
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.Handle("GET /debug/pprof/allocs", pprof.Handler("allocs"))
	mux.HandleFunc("GET "+pathCounts, func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, t.counts()) })
	mux.HandleFunc("GET "+pathArrivals, func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, t.arrivals.snapshot()) })
	mux.HandleFunc("POST "+pathFailAll, func(w http.ResponseWriter, r *http.Request) {
		on, err := strconv.ParseBool(r.URL.Query().Get("on"))
		if err != nil {
			http.Error(w, "fail-all: want ?on=1 or ?on=0", http.StatusBadRequest)
			return
		}
		at := t.work.setFailAll(on)
		fmt.Fprintf(t.log, "tier: %s: fail-all %v\n", t.name, on)
		writeJSON(w, FailAllState{FailAll: on, At: at.Round(0)})
	})
	mux.HandleFunc("POST "+pathSlow, func(w http.ResponseWriter, r *http.Request) {
		share, err := strconv.ParseFloat(r.URL.Query().Get("share"), 64)
		if err != nil || !(share >= 0 && share <= 1) {
			http.Error(w, "slow: want ?share=p, p in [0, 1]", http.StatusBadRequest)
			return
		}
		t.work.setSlow(share)
		fmt.Fprintf(t.log, "tier: %s: slow %v\n", t.name, share)
		writeJSON(w, SlowState{Share: share})
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { _ = hs.Serve(lis); close(done) }()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		<-done
	}, "http://" + lis.Addr().String() + pathCounts, nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
