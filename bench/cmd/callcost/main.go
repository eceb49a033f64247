// Command callcost measures what a request costs through the chain of
// the project's silent check (shared/checks/silent.sh, outside this
// repository: gateway -> order -> payment over bufconn, handlers that
// only forward, callers that send back to back) with each part of what stormguard does on a healthy call, against
// the same chain with no interceptor (off), in interleaved rounds:
//
//   - noop: a client and a server interceptor that pass every call on:
//     what grpc-go charges for any interceptor;
//   - depth: noop, and the client adds x-call-depth to a handler's calls,
//     as stormguard's first attempts do: what carrying the protocol's one
//     header costs in grpc-go;
//   - answer: noop, and the client asks for the header and the trailer
//     (grpc.Header, grpc.Trailer), which stormguard reads for the gRFC A6
//     commit rule and the pushback: what grpc-go's copies of them cost;
//   - depth+answer: both;
//   - recommended: interceptor.New(interceptor.Recommended()...) on every
//     tier, as the silent check runs it.
//
// For each it prints, against off, the median (and quartiles) over the
// rounds of the CPU per request (getrusage, the whole process) and of
// the goodput, and the allocations and bytes per request. See
// BENCHMARKS.md, "What a call costs".
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/interceptor"
)

type tier struct {
	testpb.UnimplementedTestServiceServer
	next testpb.TestServiceClient
}

func (t *tier) UnaryCall(ctx context.Context, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	if t.next != nil {
		return t.next.UnaryCall(ctx, in)
	}
	return &testpb.SimpleResponse{}, nil
}

// variant builds the server and dial options of one tier; hop is the
// tier's depth (0 for the edge client).
type variant struct {
	name  string
	build func(hop int) ([]grpc.ServerOption, []grpc.DialOption, error)
}

func passServer(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	return h(ctx, req)
}

// passClient returns a client interceptor that passes every call on,
// with x-call-depth added to the calls of tiers below the edge (depth)
// and the header and trailer asked for (answer).
func passClient(hop int, depth, answer bool) grpc.UnaryClientInterceptor {
	d := strconv.Itoa(hop)
	return func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if depth && hop > 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, interceptor.MetadataDepth, d)
		}
		if answer {
			// One allocation for both and the options, as stormguard
			// makes them: what is left is grpc-go's.
			a := &answerOpts{}
			a.h.HeaderAddr, a.t.TrailerAddr = &a.header, &a.trailer
			opts = append(append(a.buf[:0], opts...), &a.h, &a.t)
		}
		return inv(ctx, m, req, reply, cc, opts...)
	}
}

// answerOpts receives an attempt's header and trailer.
type answerOpts struct {
	header, trailer metadata.MD
	h               grpc.HeaderCallOption
	t               grpc.TrailerCallOption
	buf             [4]grpc.CallOption
}

func passing(depth, answer bool) func(int) ([]grpc.ServerOption, []grpc.DialOption, error) {
	return func(hop int) ([]grpc.ServerOption, []grpc.DialOption, error) {
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(passServer)},
			[]grpc.DialOption{grpc.WithChainUnaryInterceptor(passClient(hop, depth, answer))}, nil
	}
}

var variants = []variant{
	{"off", func(int) ([]grpc.ServerOption, []grpc.DialOption, error) { return nil, nil, nil }},
	{"noop", passing(false, false)},
	{"depth", passing(true, false)},
	{"answer", passing(false, true)},
	{"depth+answer", passing(true, true)},
	{"recommended", func(int) ([]grpc.ServerOption, []grpc.DialOption, error) {
		i, err := interceptor.New(interceptor.Recommended()...)
		if err != nil {
			return nil, nil, err
		}
		return i.ServerOptions(), i.DialOptions(), nil
	}},
}

// chain starts payment, order and gateway with v's options and returns
// the edge's client.
func chain(v variant) (testpb.TestServiceClient, func(), error) {
	var stops []func()
	stop := func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	var below *bufconn.Listener
	for i, t := range []*tier{{}, {}, {}} { // payment (hop 2), order, gateway (hop 0)
		sopts, dopts, err := v.build(2 - i)
		if err != nil {
			stop()
			return nil, nil, err
		}
		if below != nil {
			conn, err := dial(below, dopts)
			if err != nil {
				stop()
				return nil, nil, err
			}
			stops = append(stops, func() { conn.Close() })
			t.next = testpb.NewTestServiceClient(conn)
		}
		lis := bufconn.Listen(1 << 20)
		s := grpc.NewServer(sopts...)
		testpb.RegisterTestServiceServer(s, t)
		go s.Serve(lis)
		stops = append(stops, s.Stop)
		below = lis
	}
	_, dopts, err := v.build(0)
	if err == nil {
		var conn *grpc.ClientConn
		if conn, err = dial(below, dopts); err == nil {
			stops = append(stops, func() { conn.Close() })
			return testpb.NewTestServiceClient(conn), stop, nil
		}
	}
	stop()
	return nil, nil, err
}

func dial(lis *bufconn.Listener, opts []grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)
	return grpc.NewClient("passthrough:///bufnet", opts...)
}

func cpuTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// sample is one run of one variant.
type sample struct {
	okPerSec, cpuPerReq, allocsPerReq, bytesPerReq float64
}

// run loads cl with callers sending back to back for d; a run that no
// request of passed is an error.
func run(cl testpb.TestServiceClient, callers int, d time.Duration) (sample, error) {
	var ok, all atomic.Int64
	var wg sync.WaitGroup
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	c0, err := cpuTime()
	if err != nil {
		return sample{}, err
	}
	end := time.Now().Add(d)
	for range callers {
		wg.Go(func() {
			for time.Now().Before(end) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := cl.UnaryCall(ctx, &testpb.SimpleRequest{})
				cancel()
				all.Add(1)
				if err == nil {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	c1, err := cpuTime()
	if err != nil {
		return sample{}, err
	}
	runtime.ReadMemStats(&m1)
	if ok.Load() == 0 {
		return sample{}, fmt.Errorf("no request of %d passed", all.Load())
	}
	n := float64(all.Load())
	return sample{
		okPerSec:     float64(ok.Load()) / d.Seconds(),
		cpuPerReq:    float64(c1-c0) / float64(time.Microsecond) / n,
		allocsPerReq: float64(m1.Mallocs-m0.Mallocs) / n,
		bytesPerReq:  float64(m1.TotalAlloc-m0.TotalAlloc) / n,
	}, nil
}

// quartiles returns the quartiles of x, interpolated between ranks.
func quartiles(x []float64) (q1, med, q3 float64) {
	slices.Sort(x)
	at := func(p float64) float64 {
		r := p * float64(len(x)-1)
		i := int(r)
		if i+1 >= len(x) {
			return x[i]
		}
		return x[i] + (r-float64(i))*(x[i+1]-x[i])
	}
	return at(0.25), at(0.5), at(0.75)
}

func main() {
	if err := callcost(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "callcost:", err)
		os.Exit(2)
	}
}

// callcost runs the rounds that args ask for and writes the table to w.
func callcost(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("callcost", flag.ContinueOnError)
	callers := fs.Int("callers", 64, "callers sending back to back")
	d := fs.Duration("for", 500*time.Millisecond, "length of each run")
	rounds := fs.Int("rounds", 12, "interleaved rounds: each runs every variant once")
	only := fs.String("only", "", "run only off and the variants whose names match this `regexp`")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the rounds (not the warm-up) to `file`, each sample labelled with its variant")
	if err := fs.Parse(args); err != nil {
		return err
	}
	variants := variants
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			return fmt.Errorf("-only: %w", err)
		}
		variants = slices.DeleteFunc(slices.Clone(variants), func(v variant) bool { return v.name != "off" && !re.MatchString(v.name) })
	}
	if *callers < 1 || *rounds < 1 || *d <= 0 {
		return fmt.Errorf("want -callers >= 1, -rounds >= 1 and -for > 0")
	}
	clients := make([]testpb.TestServiceClient, len(variants))
	var stops []func()
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	for i, v := range variants {
		// The label marks every goroutine of the variant's chain in a
		// profile: those its servers and connections start inherit it.
		var err error
		pprof.Do(context.Background(), pprof.Labels("variant", v.name), func(context.Context) {
			var stop func()
			if clients[i], stop, err = chain(v); err != nil {
				return
			}
			stops = append(stops, stop)
			if _, err = run(clients[i], *callers, min(*d, 200*time.Millisecond)); err != nil { // warm the connections
				err = fmt.Errorf("%s: %w", v.name, err)
			}
		})
		if err != nil {
			return err
		}
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			if cerr := f.Close(); cerr != nil {
				fmt.Fprintln(os.Stderr, "callcost: -cpuprofile:", cerr)
			}
		}()
	}
	samples := make([][]sample, len(variants))
	for range *rounds {
		for i, cl := range clients {
			var s sample
			var err error
			pprof.Do(context.Background(), pprof.Labels("variant", variants[i].name), func(context.Context) {
				s, err = run(cl, *callers, *d)
			})
			if err != nil {
				return fmt.Errorf("%s: %w", variants[i].name, err)
			}
			samples[i] = append(samples[i], s)
		}
	}
	fmt.Fprintf(w, "%d callers, %d rounds of %v, %s, GOMAXPROCS %d\n\n", *callers, *rounds, *d, runtime.Version(), runtime.GOMAXPROCS(0))
	fmt.Fprintln(w, "| variant | CPU / request vs off: median (q1-q3) | goodput vs off: median (q1-q3) | CPU / request | allocs / request | bytes / request |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	for i, v := range variants {
		var cpu, good, allocs, bytes, abs []float64
		for r, s := range samples[i] {
			off := samples[0][r]
			cpu = append(cpu, s.cpuPerReq/off.cpuPerReq)
			good = append(good, s.okPerSec/off.okPerSec)
			abs = append(abs, s.cpuPerReq)
			allocs = append(allocs, s.allocsPerReq)
			bytes = append(bytes, s.bytesPerReq)
		}
		c1, c, c3 := quartiles(cpu)
		g1, g, g3 := quartiles(good)
		_, a, _ := quartiles(abs)
		_, al, _ := quartiles(allocs)
		_, by, _ := quartiles(bytes)
		fmt.Fprintf(w, "| %s | %.3fx (%.3f-%.3f) | %.3fx (%.3f-%.3f) | %.1f µs | %.0f | %.0f |\n", v.name, c, c1, c3, g, g1, g3, a, al, by)
	}
	return nil
}
