package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ctxT returns a context that ends with the test, bounded so that no run
// of the demo can hang.
func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// tiny is a demo run short enough for a test: what it asserts does not
// depend on the durations.
var tiny = simConfig{rate: 100, duration: 200 * time.Millisecond, users: 4, usersFor: 200 * time.Millisecond,
	seed: 1, maxRecovery: 2 * time.Second, tail: 0}

// TestSingleRequest checks the one-request column of every mode: the
// storm of DESIGN.md and its cure. The counts do not depend on timing: one
// request on a fresh chain with payment killed.
func TestSingleRequest(t *testing.T) {
	want := map[string]singleCounts{
		"naive":       {3, 9, 27},
		"one-retry":   {2, 4, 8},
		"budget":      {3, 9, 27}, // the budget's floor lets one request retry fully
		"tiered":      {1, 1, 3},
		"stormguard":  {1, 1, 3},
		"recommended": {1, 1, 3}, // cold: three failures before payment is down
	}
	rs, err := simulate(ctxT(t, 60*time.Second), tiny, modes, noProgress{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != len(modes) {
		t.Fatalf("got %d rows, want %d", len(rs), len(modes))
	}
	for _, r := range rs {
		if got := r.Single; got != want[r.Mode] {
			t.Errorf("%s: calls (gateway, order, payment) for one request: got %v, want %v", r.Mode, got, want[r.Mode])
		}
		// The open loop sends its 20 requests (100/s for 200 ms) in every
		// mode, whatever the answers; the closed loop as many as its
		// users' answers let them.
		if got := r.Sustained; got.Rate != 100 || got.Users != 0 || got.Requests != 20 || got.DurationMS != 200 {
			t.Errorf("%s: open loop: rate %d, users %d, %d requests in %d ms; want 100/s, none, 20 in 200 ms", r.Mode, got.Rate, got.Users, got.Requests, got.DurationMS)
		}
		if got := r.ClosedLoop; got.Users != 4 || got.Rate != 0 || got.DurationMS != 200 {
			t.Errorf("%s: closed loop: %d users, rate %d, %d ms; want 4, none, 200 ms", r.Mode, got.Users, got.Rate, got.DurationMS)
		}
		for phase, s := range map[string]phaseStats{"open loop": r.Sustained, "closed loop": r.ClosedLoop} {
			if s.Requests <= 0 || s.Success != 0 {
				t.Errorf("%s, %s with payment killed: %d requests, success %v; want some requests, none successful", r.Mode, phase, s.Requests, s.Success)
			}
			if s.P50MS > s.P99MS || s.P99MS > float64(requestTimeout/time.Millisecond)+500 {
				t.Errorf("%s, %s: p50 %v ms, p99 %v ms: want p50 <= p99 <= the deadline", r.Mode, phase, s.P50MS, s.P99MS)
			}
			// Calls per second of sending and per request count the same
			// calls.
			if perSecond := s.Amplification * float64(s.Requests) / (float64(s.DurationMS) / 1000); math.Abs(perSecond-s.CallsPerSecond) > 0.01*perSecond+1 {
				t.Errorf("%s, %s: %v calls/s, but %v calls per request x %d requests in %d ms", r.Mode, phase, s.CallsPerSecond, s.Amplification, s.Requests, s.DurationMS)
			}
		}
		if len(r.series) < 2 || r.usersAt <= 0 || r.restartAt <= r.usersAt {
			t.Errorf("%s: %d samples for the chart, users at %v, restart at %v", r.Mode, len(r.series), r.usersAt, r.restartAt)
		}
	}
	// Sustained amplification: naive makes 27 calls per request that runs
	// to its end, fewer for one cut short by its 2 s deadline (on a loaded
	// machine), never more; TestNaiveSustained shows the exact 27 with a
	// deadline no request reaches. Stormguard's order tier makes at most 3.
	for _, r := range rs {
		for phase, a := range map[string]float64{"open loop": r.Sustained.Amplification, "closed loop": r.ClosedLoop.Amplification} {
			switch r.Mode {
			case "naive":
				if a > 27 || a <= 3 {
					t.Errorf("naive, %s: %v calls at payment per request, want within (3, 27]", phase, a)
				}
			case "tiered", "stormguard", "recommended":
				if a > 3 {
					t.Errorf("%s, %s: %v calls at payment per request, want <= 3", r.Mode, phase, a)
				}
			}
		}
	}
}

// TestNaiveSustained: under sustained load from concurrent users, with
// payment killed, naive retries make exactly 27 calls at payment per
// request: 3 x 3 x 3, for every request, with nothing lost or added by
// concurrency. Each request gets a deadline it cannot reach (the demo's
// 2 s can be reached on a loaded machine, which cuts requests short), and
// the test checks that every request ended with payment's UNAVAILABLE,
// not at its deadline.
func TestNaiveSustained(t *testing.T) {
	i := slices.IndexFunc(modes, func(m mode) bool { return m.name == "naive" })
	if i < 0 {
		t.Fatal("no naive mode")
	}
	chain, err := startChain(modes[i], 1)
	if err != nil {
		t.Fatal(err)
	}
	defer chain.Close()
	pay := chain.Tier("payment")
	pay.Kill()
	ctx := ctxT(t, 3*time.Minute)
	const users, perUser = 4, 3
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		got = map[codes.Code]int{}
	)
	for range users {
		wg.Go(func() {
			for range perUser {
				rctx, cancel := context.WithTimeout(ctx, time.Minute)
				_, err := chain.Client().Unary(rctx, &testsvcv1.UnaryRequest{Id: "user"})
				cancel()
				mu.Lock()
				got[status.Code(err)]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if got[codes.Unavailable] != users*perUser {
		t.Fatalf("request outcomes: got %v, want %d x Unavailable", got, users*perUser)
	}
	if calls, want := pay.Attempts(testsvc.Unary), int64(27*users*perUser); calls != want {
		t.Fatalf("calls at payment for %d requests: got %d, want %d (27 each)", users*perUser, calls, want)
	}
}

// TestJSON runs the demo as the command line does and checks the JSON
// format: one array, one object per mode, with exactly the documented
// fields.
func TestJSON(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "chart.png")
	var stdout, stderr bytes.Buffer
	err := run(ctxT(t, 60*time.Second), []string{
		"--json", "--modes", "naive,tiered", "--rate", "40", "--duration", "150ms", "--users", "2", "--users-for", "100ms",
		"--max-recovery", "1s", "--chart", chart,
	}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v (stderr %q)", err, stderr.String())
	}
	var rows []map[string]json.RawMessage
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatalf("--json output is not a JSON array: %v\n%s", err, stdout.String())
	}
	if len(rows) != 2 {
		t.Fatalf("got %d objects, want 2", len(rows))
	}
	keysOf := func(m map[string]json.RawMessage) []string {
		var k []string
		for key := range m {
			k = append(k, key)
		}
		slices.Sort(k)
		return k
	}
	for i, row := range rows {
		if got, want := keysOf(row), []string{"closed_loop", "mode", "recovery_ms", "single", "sustained"}; !slices.Equal(got, want) {
			t.Fatalf("object %d: fields %v, want %v", i, got, want)
		}
		for name, want := range map[string][]string{
			"single":      {"gateway", "order", "payment"},
			"sustained":   {"amplification", "calls_per_second", "duration_ms", "p50_ms", "p99_ms", "rate", "requests", "success"},
			"closed_loop": {"amplification", "calls_per_second", "duration_ms", "p50_ms", "p99_ms", "requests", "success", "users"},
		} {
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(row[name], &fields); err != nil {
				t.Fatal(err)
			}
			if got := keysOf(fields); !slices.Equal(got, want) {
				t.Fatalf("object %d, %s: fields %v, want %v", i, name, got, want)
			}
		}
	}
	var rs []result
	if err := json.Unmarshal(stdout.Bytes(), &rs); err != nil {
		t.Fatal(err)
	}
	if rs[0].Mode != "naive" || rs[0].Single != (singleCounts{3, 9, 27}) || rs[1].Mode != "tiered" || rs[1].Single != (singleCounts{1, 1, 3}) {
		t.Fatalf("rows: got %+v", rs)
	}
	for _, r := range rs {
		// 40/s for 150 ms: at 0, 25, ... 125 ms.
		if s := r.Sustained; s.Rate != 40 || s.Requests != 6 || s.DurationMS != 150 {
			t.Errorf("%s: sustained %+v, want 6 requests at 40/s in 150 ms", r.Mode, s)
		}
		if s := r.ClosedLoop; s.Users != 2 || s.DurationMS != 100 || s.Requests < 1 {
			t.Errorf("%s: closed loop %+v, want 2 users for 100 ms", r.Mode, s)
		}
	}
	if fi, err := os.Stat(chart); err != nil || fi.Size() == 0 {
		t.Fatalf("chart %s: %v", chart, err)
	}
	if _, err := os.Stat(chart + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary chart file left behind: %v", err)
	}
	if want := "chart written to " + chart; !strings.Contains(stderr.String(), want) {
		t.Fatalf("stderr %q does not say %q", stderr.String(), want)
	}
}

func TestTable(t *testing.T) {
	var out bytes.Buffer
	cfg := simConfig{rate: 200, duration: 2 * time.Second, users: 32, usersFor: time.Second, maxRecovery: 8 * time.Second}
	err := writeTable(&out, cfg, modes[:2], []result{
		{Mode: "naive", Single: singleCounts{3, 9, 27},
			Sustained:  phaseStats{Rate: 200, DurationMS: 2000, Requests: 400, CallsPerSecond: 5400, Amplification: 27, P50MS: 990, P99MS: 1100},
			ClosedLoop: phaseStats{Users: 32, DurationMS: 1000, Requests: 46, CallsPerSecond: 1242, Amplification: 27, P50MS: 980, P99MS: 1200},
			RecoveryMS: 100},
		{Mode: "one-retry", Single: singleCounts{2, 4, 8}, RecoveryMS: -1},
	})
	if err != nil {
		t.Fatal(err)
	}
	text := out.String()
	open, closed, found := strings.Cut(text, "32 users: then 32 users for 1s, closed loop")
	if !found {
		t.Fatalf("no closed-loop table:\n%s", text)
	}
	for _, want := range []string{"200 req/s: then 200 user requests a second for 2s, open loop", "3 / 9 / 27", "400", "5400", "27.00", "1100 ms", "2 / 4 / 8"} {
		if !strings.Contains(open, want) {
			t.Errorf("open-loop part lacks %q:\n%s", want, open)
		}
	}
	for _, want := range []string{"46", "1242", "27.00", "1200 ms", "100 ms", "> 8000 ms"} {
		if !strings.Contains(closed, want) {
			t.Errorf("closed-loop part lacks %q:\n%s", want, closed)
		}
	}
	if strings.Contains(open, "recovery  ") || strings.Contains(closed, "3 / 9 / 27") {
		t.Errorf("a column in the wrong table:\n%s", text)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--modes", "naive,nope"},
		{"--modes", "adaptive"}, // now recommended
		{"--modes", "naive,naive"},
		{"--users", "0"},
		{"--duration", "0s"},
		{"--users-for", "0s"},
		{"--users-for", "2h"},
		{"--rate", "0"},
		{"--rate", "-5"},
		{"--rate", "10001"},
		{"--flaky", "1.5"},
		{"--chart", "out.gif"},
		{"extra"},
		{"serve", "--tier", "nope"},
		{"serve", "--tier", "order"},
		{"serve", "--tier", "payment", "--next", "127.0.0.1:1"},
		{"serve", "--tier", "payment", "--mode", "adaptive"},
		{"load"},
		{"load", "--target", "127.0.0.1:1", "--mode", "adaptive"},
		// Addresses gRPC could never dial (from a user's trial: accepted,
		// then every request failed in silence).
		{"load", "--target", "nonsense"},
		{"load", "--target", "127.0.0.1:1", "--stats", "127.0.0.1:1,nonsense"},
		{"serve", "--tier", "order", "--listen", "127.0.0.1:0", "--next", "nonsense"},
	} {
		runFails(t, args...)
	}
}

// runFails runs stormsim with args and fails the test unless it refuses
// them. The context has already ended, so that arguments that are wrongly
// accepted cannot pass by running out of time: run fails at once with the
// context's error, which this reports.
func runFails(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, &stdout, &stderr)
	switch {
	case err == nil:
		t.Errorf("run(%q): got no error", args)
	case errors.Is(err, context.Canceled):
		t.Errorf("run(%q): accepted, ran and was cancelled (%v); want the arguments refused", args, err)
	}
}

func TestFmtDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                        "0 ms",
		40 * time.Microsecond:    "0.04 ms",
		2500 * time.Microsecond:  "2.5 ms",
		87 * time.Millisecond:    "87 ms",
		1180 * time.Millisecond:  "1180 ms",
		12300 * time.Millisecond: "12.3 s",
	} {
		if got := fmtDuration(d); got != want {
			t.Errorf("fmtDuration(%v): got %q, want %q", d, got, want)
		}
	}
}

func TestPercentile(t *testing.T) {
	s := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for p, want := range map[float64]time.Duration{0.5: 5, 0.99: 10, 0.1: 1, 0: 1, 1: 10} {
		if got := percentile(s, p); got != want {
			t.Errorf("percentile(%v): got %v, want %v", p, got, want)
		}
	}
}

// The first Ctrl-C says that what has finished is printed; after
// it the signals are given back (a second one ends the process). main's
// own stop at the end says nothing.
func TestQuitOnSecondSignal(t *testing.T) {
	for _, tc := range []struct {
		cause error
		want  string
	}{
		{errors.New("interrupt signal received"), "stormsim: interrupted: printing what has finished once the run in progress stops (Ctrl-C again to quit now)\n"},
		{nil, ""}, // main's stop
	} {
		ctx, cancel := context.WithCancelCause(context.Background())
		stopped := make(chan struct{})
		var stderr bytes.Buffer
		done := make(chan struct{})
		go func() {
			quitOnSecondSignal(ctx, func() { close(stopped) }, &stderr)
			close(done)
		}()
		cancel(tc.cause)
		<-done
		select {
		case <-stopped:
		default:
			t.Fatalf("cause %v: the signals were not given back", tc.cause)
		}
		if stderr.String() != tc.want {
			t.Errorf("cause %v: wrote %q, want %q", tc.cause, stderr.String(), tc.want)
		}
	}
}

// A run that a Ctrl-C stopped prints what finished before it and ends
// with errInterrupted (exit status 130); one stopped before anything
// finished prints nothing; another error prints nothing and is returned.
// (A user's trial: the first Ctrl-C printed "stopping after the run in
// progress" and then threw away every finished mode's results.)
func TestPrintFinished(t *testing.T) {
	live := context.Background()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		err     error
		n       int
		printed bool
		want    error
	}{
		{"all finished", live, nil, 3, true, nil},
		{"interrupted after 2", done, context.Canceled, 2, true, errInterrupted},
		{"interrupted before any", done, context.Canceled, 0, false, errInterrupted},
		{"failed", live, boom, 2, false, boom},
	} {
		printed := false
		err := printFinished(tc.ctx, tc.err, tc.n, func() error { printed = true; return nil })
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) || printed != tc.printed {
			t.Errorf("%s: err %v, printed %v; want %v, %v", tc.name, err, printed, tc.want, tc.printed)
		}
	}
	// End to end: the demo and a scenario interrupted before their first
	// run print nothing and say so.
	for _, args := range [][]string{
		{"--modes", "tiered", "--duration", "50ms", "--users-for", "50ms"},
		{"--scenario", "tail", "--modes", "retries"},
		{"--scenario", "outage", "--modes", "tiered"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(done, args, &stdout, &stderr); !errors.Is(err, errInterrupted) || stdout.Len() != 0 {
			t.Errorf("%v interrupted at once: err %v, stdout %q; want errInterrupted, nothing", args, err, stdout.String())
		}
	}
}

// load against an address where nothing listens says why its requests
// fail, in its summary (a user's trial: 0 % success for a minute, and
// no word of "connection refused").
func TestLoadSaysWhyRequestsFail(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, []string{"load", "--target", addr, "--users", "2", "--duration", "300ms", "--interval", "100ms", "--mode", "tiered"}, &stdout, &stderr); err != nil {
		t.Fatalf("load: %v", err)
	}
	if out := stdout.String(); !strings.Contains(out, "last failure: Unavailable: ") || !strings.Contains(out, "connection refused") {
		t.Fatalf("summary does not say why requests failed:\n%s", out)
	}
}

// A bad flag is one line, the error, which says where the flags are;
// the usage is printed only when asked for (a user's trial: a bad value
// printed the error above some 60 lines of usage, which scrolled it away).
func TestBadFlagIsOneLine(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, args := range [][]string{{"--rate", "abc"}, {"load", "--users", "x"}, {"serve", "--tier"}} {
		var stdout, stderr bytes.Buffer
		err := run(ctx, args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), "-h' for the flags)") || stderr.Len() != 0 {
			t.Errorf("%q: err %v, stderr %q; want the error alone, with the hint", args, err, stderr.String())
		}
	}
	for _, args := range [][]string{{"-h"}, {"load", "-h"}, {"serve", "--help"}} {
		var stdout, stderr bytes.Buffer
		if err := run(ctx, args, &stdout, &stderr); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), "Usage: stormsim") || !strings.Contains(stderr.String(), "  -") {
			t.Errorf("%q: err %v, stderr %d bytes; want the usage with the flags", args, err, stderr.Len())
		}
	}
}
