package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// raceEnabled is set by race_test.go: the binary is then built with -race
// too, so that it links the packages the test already compiled.
var raceEnabled bool

// buildBinary builds stormsim into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to build stormsim: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "stormsim")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command(goTool, append(args, ".")...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// syncBuffer is a bytes.Buffer safe for the process's writer and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a process the test started. Its stdout lines arrive on lines,
// which is closed when the process has exited.
type proc struct {
	name   string
	cmd    *exec.Cmd
	lines  chan string
	done   chan struct{}
	stderr *syncBuffer
	addr   string // for a tier: the address it listens on
}

func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{
		name:   name,
		cmd:    exec.Command(bin, args...),
		lines:  make(chan string, 1<<14),
		done:   make(chan struct{}),
		stderr: &syncBuffer{},
	}
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// If this test process dies without its cleanups (a -timeout panic, a
	// kill), the child must die too, not run on as an orphan.
	setParentDeathSignal(p.cmd)
	runtime.LockOSThread() // the signal follows the thread that forked
	err = p.cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // the test stopped reading; keep the pipe drained
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = p.cmd.Wait() // after every read from the pipe, as Wait requires
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// expect reads lines until one satisfies ok, failing the test after
// timeout or when the process ends first.
func (p *proc) expect(t *testing.T, timeout time.Duration, what string, ok func(string) bool) string {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case line, open := <-p.lines:
			if !open {
				t.Fatalf("%s exited before %s; stderr:\n%s", p.name, what, p.stderr.String())
			}
			if ok(line) {
				return line
			}
		case <-timer.C:
			t.Fatalf("%s: no %s within %v; stderr:\n%s", p.name, what, timeout, p.stderr.String())
		}
	}
}

// kill sends SIGKILL, as a crash would, and waits for the process to end.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s: %v", p.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not exit after SIGKILL", p.name)
	}
}

// startTier starts one tier in stormguard mode and waits for the address it
// prints.
func startTier(t *testing.T, bin, tier, listen, next string) *proc {
	t.Helper()
	args := []string{"serve", "--tier", tier, "--listen", listen, "--mode", "stormguard"}
	if next != "" {
		args = append(args, "--next", next)
	}
	p := startProc(t, tier, bin, args...)
	p.addr = p.expect(t, 20*time.Second, "listen address", func(string) bool { return true })
	if !strings.HasPrefix(p.addr, "127.0.0.1:") {
		t.Fatalf("%s printed %q, want a 127.0.0.1 address", tier, p.addr)
	}
	return p
}

// tierCounts asks a tier process for its counts: unary calls received and
// sent to the next tier (-1 when it reports none).
func tierCounts(t *testing.T, ctx context.Context, addr string) (received, sent int64) {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var header metadata.MD
	resp, err := testsvcv1.NewStatsServiceClient(conn).GetStats(ctx, &testsvcv1.GetStatsRequest{}, grpc.Header(&header))
	if err != nil {
		t.Fatalf("GetStats %s: %v", addr, err)
	}
	sent = -1
	if n, ok := testsvc.SentFromHeader(header, testsvc.Unary); ok {
		sent = n
	}
	return resp.GetReceived()[testsvc.Unary.String()], sent
}

// windowCounts returns the window_ok and window_failed counts of a load line.
func windowCounts(line string) (ok, failed int) {
	for f := range strings.FieldsSeq(line) {
		if v, found := strings.CutPrefix(f, "window_ok="); found {
			ok, _ = strconv.Atoi(v)
		}
		if v, found := strings.CutPrefix(f, "window_failed="); found {
			failed, _ = strconv.Atoi(v)
		}
	}
	return ok, failed
}

// TestProcesses runs the chain as three processes over TCP in stormguard
// mode: one request with payment killed gives the in-process counts; then
// payment is killed under load and comes back on the same address.
func TestProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs stormsim processes")
	}
	bin := buildBinary(t)
	ctx := ctxT(t, 2*time.Minute)
	stormguard, err := findMode("stormguard")
	if err != nil {
		t.Fatal(err)
	}

	// The in-process numbers for one request with payment killed.
	chain, err := startChain(stormguard, 1)
	if err != nil {
		t.Fatal(err)
	}
	chain.Tier("payment").Kill()
	want := oneRequest(ctx, chain)
	chain.Close()

	pay := startTier(t, bin, "payment", "127.0.0.1:0", "")
	order := startTier(t, bin, "order", "127.0.0.1:0", pay.addr)
	gw := startTier(t, bin, "gateway", "127.0.0.1:0", order.addr)

	// One request with payment killed.
	pay.kill(t)
	edge, err := dialEdge(gw.addr, stormguard)
	if err != nil {
		t.Fatal(err)
	}
	defer edge.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = testsvcv1.NewTestServiceClient(edge).Unary(rctx, &testsvcv1.UnaryRequest{Id: "one"})
	cancel()
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("one request with payment killed: got %v, want Unavailable", err)
	}
	gwReceived, gwSent := tierCounts(t, ctx, gw.addr)
	orderReceived, orderSent := tierCounts(t, ctx, order.addr)
	got := singleCounts{Gateway: gwReceived, Order: orderReceived, Payment: orderSent}
	if got != want || gwSent != orderReceived {
		t.Fatalf("processes, one request with payment killed (gateway, order, payment): got %v (gateway sent %d), want %v as in process",
			got, gwSent, want)
	}
	t.Logf("one request with payment killed: %v calls (gateway, order, payment), as in process", got)

	// Payment back on the same address, then killed under load.
	pay = startTier(t, bin, "payment", pay.addr, "")
	load := startProc(t, "load", bin, "load", "--target", gw.addr, "--users", "8", "--duration", "60s",
		"--interval", "100ms", "--mode", "stormguard", "--stats", strings.Join([]string{gw.addr, order.addr, pay.addr}, ","))
	load.expect(t, 20*time.Second, "successful requests", func(l string) bool { ok, _ := windowCounts(l); return ok > 0 })
	pay.kill(t)
	// Ten windows of only failures: about a second of outage, time for
	// the breakers to see it.
	var line string
	for range 10 {
		line = load.expect(t, 20*time.Second, "only failures after the kill", func(l string) bool {
			ok, failed := windowCounts(l)
			return ok == 0 && failed > 0
		})
	}
	t.Logf("payment killed under load: %s", line)

	// Payment restarted: users must succeed again, bounded in time.
	startTier(t, bin, "payment", pay.addr, "") // stopped by its cleanup
	restarted := time.Now()
	line = load.expect(t, 30*time.Second, "a window of successes after the restart", func(l string) bool {
		ok, failed := windowCounts(l)
		return ok > 0 && float64(ok) >= recoveredSuccess*float64(ok+failed)
	})
	t.Logf("users succeed again %v after payment restarted: %s", time.Since(restarted).Round(10*time.Millisecond), line)

	if err := load.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	line = load.expect(t, 10*time.Second, "the summary", func(l string) bool { return strings.HasPrefix(l, "total ") })
	t.Logf("load: %s", line)
	select {
	case <-load.done:
	case <-time.After(10 * time.Second):
		t.Fatal("load did not exit after its summary")
	}

	// Only order retries, with at most 3 attempts per call it receives;
	// gateway passes every failure up without retrying. (Sent and received
	// counts of neighbours may differ by the calls the load cancelled on
	// its way out.)
	gwReceived, gwSent = tierCounts(t, ctx, gw.addr)
	orderReceived, orderSent = tierCounts(t, ctx, order.addr)
	if gwSent > gwReceived {
		t.Errorf("gateway sent %d attempts for %d calls: it retried", gwSent, gwReceived)
	}
	if orderSent > 3*orderReceived {
		t.Errorf("order sent %d attempts for %d calls: more than 3 each", orderSent, orderReceived)
	}
	t.Logf("totals: gateway received %d, order received %d, order sent payment %d", gwReceived, orderReceived, orderSent)
}

// TestMetricsDuringOutage scrapes order's Prometheus endpoint while payment
// is dead and finds what an operator would look for: refused retries by
// reason and order's breaker for payment open (mode stormguard, the one
// with breakers).
func TestMetricsDuringOutage(t *testing.T) {
	bin := buildBinary(t)
	ctx := ctxT(t, 2*time.Minute)
	pay := startTier(t, bin, "payment", "127.0.0.1:0", "")
	order := startProc(t, "order", bin, "serve", "--tier", "order", "--listen", "127.0.0.1:0",
		"--next", pay.addr, "--metrics", "127.0.0.1:0", "--mode", "stormguard")
	order.addr = order.expect(t, 20*time.Second, "listen address", func(string) bool { return true })
	metricsURL := strings.TrimPrefix(order.expect(t, 20*time.Second, "metrics URL", func(l string) bool {
		return strings.HasPrefix(l, "metrics http://127.0.0.1:")
	}), "metrics ")
	gw := startTier(t, bin, "gateway", "127.0.0.1:0", order.addr)
	pay.kill(t)

	stormguard, err := findMode("stormguard")
	if err != nil {
		t.Fatal(err)
	}
	edge, err := dialEdge(gw.addr, stormguard)
	if err != nil {
		t.Fatal(err)
	}
	defer edge.Close()
	cl := testsvcv1.NewTestServiceClient(edge)
	// 100 failed attempts open order's breaker; order makes up to 3 per
	// request. 200 requests are more than enough, and each fails fast.
	for range 200 {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := cl.Unary(rctx, &testsvcv1.UnaryRequest{})
		cancel()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("with payment killed: got %v, want Unavailable", err)
		}
	}

	scrapeFor(t, ctx, metricsURL,
		`(?m)^stormguard_client_retry_refusals_total\{[^}]*stormguard_reason="attempts"[^}]*\} [1-9]`,
		`(?m)^stormguard_client_retry_refusals_total\{[^}]*stormguard_reason="breaker_open"[^}]*\} [1-9]`,
		`(?m)^stormguard_breaker_state\{[^}]*stormguard_target="`+regexp.QuoteMeta(pay.addr)+`"[^}]*\} 2$`,
		`(?m)^stormguard_breaker_transitions_total\{[^}]*stormguard_breaker_to_state="open"[^}]*\} [1-9]`,
		`(?m)^stormguard_server_pushbacks_total\{[^}]*\} [1-9]`,
	)
}

// scrapeFor scrapes url and fails t unless every pattern matches a line.
func scrapeFor(t *testing.T, ctx context.Context, url string, patterns ...string) {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: status %d, %v", url, resp.StatusCode, err)
	}
	text := string(body)
	for _, p := range patterns {
		if !regexp.MustCompile(p).MatchString(text) {
			t.Errorf("the metrics have no line matching %s", p)
		}
	}
	if t.Failed() {
		t.Logf("scraped:\n%s", text)
	}
}

// With Recommended() (mode recommended, the default), the metrics show
// what protects it: payment down in order's adaptive throttle, the
// transition, and order's admission gauges. (An operator's trial: served
// with stormotel.New alone, the throttle and admission control, the
// mechanisms of Recommended, had no series at all.)
func TestMetricsRecommendedOutage(t *testing.T) {
	bin := buildBinary(t)
	ctx := ctxT(t, 2*time.Minute)
	pay := startTier(t, bin, "payment", "127.0.0.1:0", "")
	order := startProc(t, "order", bin, "serve", "--tier", "order", "--listen", "127.0.0.1:0",
		"--next", pay.addr, "--metrics", "127.0.0.1:0")
	order.addr = order.expect(t, 20*time.Second, "listen address", func(string) bool { return true })
	metricsURL := strings.TrimPrefix(order.expect(t, 20*time.Second, "metrics URL", func(l string) bool {
		return strings.HasPrefix(l, "metrics http://127.0.0.1:")
	}), "metrics ")
	tiered, err := findMode("tiered")
	if err != nil {
		t.Fatal(err)
	}
	edge, err := dialEdge(order.addr, tiered)
	if err != nil {
		t.Fatal(err)
	}
	defer edge.Close()
	cl := testsvcv1.NewTestServiceClient(edge)
	call := func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := cl.Unary(rctx, &testsvcv1.UnaryRequest{})
		return err
	}
	if err := call(); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	pay.kill(t)
	for range 10 {
		_ = call()
	}
	scrapeFor(t, ctx, metricsURL,
		`(?m)^stormguard_adaptive_down\{[^}]*stormguard_target="`+regexp.QuoteMeta(pay.addr)+`"[^}]*\} 1$`,
		`(?m)^stormguard_adaptive_transitions_total\{[^}]*stormguard_adaptive_down="true"[^}]*\} [1-9]`,
		`(?m)^stormguard_adaptive_rejection_probability_ratio\{[^}]*\} 1$`,
		`(?m)^stormguard_admission_in_flight\{[^}]*stormguard_admission_server="order"[^}]*\} `,
	)
}
