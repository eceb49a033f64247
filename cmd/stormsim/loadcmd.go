package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// load drives a gateway process with paced users, as the demo's sustained
// phase does, and prints one line of live counts per interval: the users'
// view since the start and in the last interval, and what each tier named
// by --stats reports.
func load(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stormsim load", flag.ContinueOnError)
	shortUsage(fs, args, stderr, func() {
		fmt.Fprintf(stderr, "Usage: stormsim load --target ADDR [--users N] [--duration D] [--stats ADDR,...] [--mode MODE]\n\n"+
			"Sends requests to the gateway at --target, as --users users that each send one request\n"+
			"every %v with a %v deadline, and prints a line of counts every --interval:\n"+
			"requests, ok and failed since the start and in the last interval (window_ok, window_failed),\n"+
			"then per tier of --stats the calls it received, failed, and sent to the next tier.\n"+
			"Interrupt it (or wait for --duration) for a summary.\n\nFlags:\n", userPace, requestTimeout)
		fs.PrintDefaults()
	})
	target := fs.String("target", "", "`address` of the gateway")
	users := fs.Int("users", 32, "concurrent users")
	duration := fs.Duration("duration", time.Minute, "how long to send requests")
	statsAddrs := fs.String("stats", "", "comma-separated `addresses` of the tiers to ask for their counts")
	modeName := fs.String("mode", recommendedMode, "retry stack of the edge client: one of "+fmt.Sprint(modeNames()))
	interval := fs.Duration("interval", time.Second, "how often to print the counts")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("load: unexpected argument %q", fs.Arg(0))
	case *target == "":
		return fmt.Errorf("load: --target is required")
	case *users < 1 || *users > 10000:
		return fmt.Errorf("load: --users %d: want 1 to 10000", *users)
	case *duration <= 0:
		return fmt.Errorf("load: --duration %v: want more than 0", *duration)
	case *interval < 10*time.Millisecond:
		return fmt.Errorf("load: --interval %v: want at least 10ms", *interval)
	}
	if err := checkAddr("--target", *target); err != nil {
		return fmt.Errorf("load: %w", err)
	}
	m, err := findMode(*modeName)
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	conn, err := dialEdge(*target, m)
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	defer conn.Close()

	var stats []*tierStats
	for addr := range strings.SplitSeq(*statsAddrs, ",") {
		if addr = strings.TrimSpace(addr); addr == "" {
			continue
		}
		if err := checkAddr("--stats", addr); err != nil {
			return fmt.Errorf("load: %w", err)
		}
		sc, err := grpc.NewClient("passthrough:///"+addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithConnectParams(connectParams))
		if err != nil {
			return fmt.Errorf("load: %w", err)
		}
		defer sc.Close()
		stats = append(stats, &tierStats{addr: addr, client: testsvcv1.NewStatsServiceClient(sc)})
	}

	fmt.Fprintf(stderr, "stormsim: load (%s): %d users to %s\n", m.name, *users, *target)
	rec := &recorder{}
	start := time.Now()
	u := startUsers(testsvcv1.NewTestServiceClient(conn), *users, rec)
	end := time.NewTimer(*duration)
	defer end.Stop()
	ticker := time.NewTicker(*interval)
	defer ticker.Stop()
	seen := 0
	line := func() {
		fresh := rec.since(seen)
		seen += len(fresh)
		w := summarize(fresh)
		fmt.Fprintf(stdout, "t=%.1fs requests=%d ok=%d failed=%d window_ok=%d window_failed=%d%s\n",
			time.Since(start).Seconds(), rec.requests(), rec.ok.Load(), rec.failed.Load(),
			int(w.success*float64(w.requests)+0.5), w.requests-int(w.success*float64(w.requests)+0.5),
			statsLine(stats, *interval))
	}
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-end.C:
			break loop
		case <-ticker.C:
			line()
		}
	}
	u.stop()
	line()
	s := summarize(rec.since(0))
	fmt.Fprintf(stdout, "total requests=%d ok=%d failed=%d success=%.2f%% p50=%s p99=%s\n",
		s.requests, rec.ok.Load(), rec.failed.Load(), s.success*100, fmtDuration(s.p50), fmtDuration(s.p99))
	if err := rec.lastError(); err != nil {
		st := status.Convert(err)
		fmt.Fprintf(stdout, "last failure: %s: %s\n", st.Code(), st.Message())
	}
	return nil
}

// checkAddr refuses an address that gRPC could never dial: it wants a
// host and a port.
func checkAddr(flagName, addr string) error {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return fmt.Errorf("%s %q: want host:port, such as 127.0.0.1:7001", flagName, addr)
	}
	return nil
}

// tierStats asks one tier for its counts.
type tierStats struct {
	addr   string
	client testsvcv1.StatsServiceClient
}

// statsLine returns " | tier received=N failed=N sent=N" for each tier, or
// " | ADDR unreachable"; each tier gets at most timeout to answer. It does
// not take the command's context: the last line, after an interrupt, still
// asks.
func statsLine(stats []*tierStats, timeout time.Duration) string {
	var b strings.Builder
	for _, s := range stats {
		cctx, cancel := context.WithTimeout(context.Background(), min(timeout, 500*time.Millisecond))
		var header metadata.MD
		resp, err := s.client.GetStats(cctx, &testsvcv1.GetStatsRequest{}, grpc.Header(&header))
		cancel()
		if err != nil {
			fmt.Fprintf(&b, " | %s unreachable", s.addr)
			continue
		}
		fmt.Fprintf(&b, " | %s received=%d failed=%d", resp.GetTier(), resp.GetReceived()[testsvc.Unary.String()], resp.GetFailed())
		if n, ok := testsvc.SentFromHeader(header, testsvc.Unary); ok {
			fmt.Fprintf(&b, " sent=%d", n)
		}
	}
	return b.String()
}
