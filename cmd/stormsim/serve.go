package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// connectParams make a restarted tier reachable again within tens of
// milliseconds, as in the in-process chain (grpc-go's default backoff
// grows to 2 minutes).
var connectParams = grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay:  10 * time.Millisecond,
		Multiplier: 1.6,
		Jitter:     0.2,
		MaxDelay:   100 * time.Millisecond,
	},
	MinConnectTimeout: time.Second,
}

// dial connects to a tier at addr over TCP with the dial options of a
// process's stack and extra options after them.
func dial(addr string, st stack, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(connectParams),
	}
	opts = append(append(opts, st.dial...), extra...)
	return grpc.NewClient("passthrough:///"+addr, opts...)
}

// dialEdge connects to a gateway at addr as an edge client in mode m: a
// process of its own, with a fresh stack.
func dialEdge(addr string, m mode) (*grpc.ClientConn, error) {
	st, err := m.process(nil)
	if err != nil {
		return nil, err
	}
	return dial(addr, st)
}

// serve runs one tier of the chain over TCP until ctx ends. It prints the
// address it listens on as the first line of stdout.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stormsim serve", flag.ContinueOnError)
	shortUsage(fs, args, stderr, func() {
		fmt.Fprintf(stderr, "Usage: stormsim serve --tier gateway|order|payment --listen ADDR [--next ADDR] [--mode MODE] [--metrics ADDR]\n\n"+
			"Runs one tier of the chain as its own process and prints the address it listens on\n"+
			"(and, with --metrics, a second line: metrics URL).\n"+
			"Every tier but payment forwards each call to --next. Start payment, then order, then\n"+
			"gateway, all with the same --mode; drive them with stormsim load.\n\nFlags:\n")
		fs.PrintDefaults()
	})
	tier := fs.String("tier", "", "the tier to run: gateway, order or payment")
	listen := fs.String("listen", "127.0.0.1:0", "TCP `address` to listen on (port 0 picks a free port)")
	next := fs.String("next", "", "`address` of the next tier (gateway: order's, order: payment's)")
	modeName := fs.String("mode", recommendedMode, "retry stack on this tier: one of "+fmt.Sprint(modeNames()))
	flaky := fs.Float64("flaky", 0, "fail each call with `probability` p in [0, 1]")
	seed := fs.Uint64("seed", 1, "seed of the random faults")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics at http://`ADDR`/metrics (a loopback address; stormguard's metrics, so only the budget, tiered, stormguard and recommended modes have any)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	idx := slices.Index(testsvc.DefaultTiers, *tier)
	last := len(testsvc.DefaultTiers) - 1
	switch {
	case idx < 0:
		return fmt.Errorf("serve: --tier %q: want one of %v", *tier, testsvc.DefaultTiers)
	case idx < last && *next == "":
		return fmt.Errorf("serve: --tier %s needs --next, the address of %s", *tier, testsvc.DefaultTiers[idx+1])
	case idx == last && *next != "":
		return fmt.Errorf("serve: --tier %s is the last tier and takes no --next", *tier)
	case !(*flaky >= 0 && *flaky <= 1):
		return fmt.Errorf("serve: --flaky %v: want a probability in [0, 1]", *flaky)
	}
	if *next != "" {
		if err := checkAddr("--next", *next); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	m, err := findMode(*modeName)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}

	var (
		tm          *telemetry
		metricsHere net.Addr
	)
	if *metricsAddr != "" {
		var stop func()
		tm, metricsHere, stop, err = serveMetrics(*metricsAddr, *tier, stderr)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		defer stop()
	}

	// One stack for the process: its client side on the connection to
	// the next tier, its server side on its server.
	st, err := m.process(tm)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	var (
		nextClient testsvcv1.TestServiceClient
		sentTo     *testsvc.Tier // counts what this tier sends to the next
	)
	if *next != "" {
		sentTo = testsvc.NewTier(testsvc.DefaultTiers[idx+1], nil, 0)
		conn, err := dial(*next, st, sentTo.CountingDialOptions()...)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		defer conn.Close()
		nextClient = testsvcv1.NewTestServiceClient(conn)
	}
	t := testsvc.NewTier(*tier, nextClient, *seed)
	t.SetFlaky(*flaky)
	srv := grpc.NewServer(append(t.AdmissionOptions(), st.server...)...)
	t.Register(srv, sentTo)

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	fmt.Fprintln(stdout, lis.Addr().String())
	fmt.Fprintf(stderr, "stormsim: %s (%s) listening on %s\n", *tier, m.name, lis.Addr())
	if metricsHere != nil {
		fmt.Fprintf(stdout, "metrics http://%s/metrics\n", metricsHere)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// Calls in flight get a moment to finish, then are cut.
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(requestTimeout):
		srv.Stop()
		<-stopped
	}
	<-done
	return nil
}
