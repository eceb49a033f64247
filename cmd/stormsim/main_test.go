package main

import (
	"bytes"
	"context"
	"encoding/json"
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
var tiny = simConfig{users: 4, duration: 200 * time.Millisecond, seed: 1, maxRecovery: 2 * time.Second, tail: 0}

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
		s := r.Sustained
		if s.Requests <= 0 || s.Success != 0 {
			t.Errorf("%s: sustained load with payment killed: %d requests, success %v; want some requests, none successful", r.Mode, s.Requests, s.Success)
		}
		if s.P50MS > s.P99MS || s.P99MS > float64(requestTimeout/time.Millisecond)+500 {
			t.Errorf("%s: p50 %v ms, p99 %v ms: want p50 <= p99 <= the deadline", r.Mode, s.P50MS, s.P99MS)
		}
		if len(r.series) < 2 || r.restartAt <= 0 {
			t.Errorf("%s: %d samples for the chart, restart at %v", r.Mode, len(r.series), r.restartAt)
		}
	}
	// Sustained amplification: naive makes 27 calls per request that runs
	// to its end, fewer for one cut short by its 2 s deadline (on a loaded
	// machine), never more; TestNaiveSustained shows the exact 27 with a
	// deadline no request reaches. Stormguard's order tier makes at most 3.
	for _, r := range rs {
		switch r.Mode {
		case "naive":
			if a := r.Sustained.Amplification; a > 27 || a <= 3 {
				t.Errorf("naive: %v calls at payment per request, want within (3, 27]", a)
			}
		case "tiered", "stormguard", "recommended":
			if r.Sustained.Amplification > 3 {
				t.Errorf("%s: %v calls at payment per request, want <= 3", r.Mode, r.Sustained.Amplification)
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
		"--json", "--modes", "naive,tiered", "--users", "2", "--duration", "150ms",
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
		if got, want := keysOf(row), []string{"mode", "recovery_ms", "single", "sustained"}; !slices.Equal(got, want) {
			t.Fatalf("object %d: fields %v, want %v", i, got, want)
		}
		var single, sustained map[string]json.RawMessage
		if err := json.Unmarshal(row["single"], &single); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(row["sustained"], &sustained); err != nil {
			t.Fatal(err)
		}
		if got, want := keysOf(single), []string{"gateway", "order", "payment"}; !slices.Equal(got, want) {
			t.Fatalf("single: fields %v, want %v", got, want)
		}
		if got, want := keysOf(sustained), []string{"amplification", "p50_ms", "p99_ms", "requests", "success"}; !slices.Equal(got, want) {
			t.Fatalf("sustained: fields %v, want %v", got, want)
		}
	}
	var rs []result
	if err := json.Unmarshal(stdout.Bytes(), &rs); err != nil {
		t.Fatal(err)
	}
	if rs[0].Mode != "naive" || rs[0].Single != (singleCounts{3, 9, 27}) || rs[1].Mode != "tiered" || rs[1].Single != (singleCounts{1, 1, 3}) {
		t.Fatalf("rows: got %+v", rs)
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
	err := writeTable(&out, simConfig{users: 32, duration: time.Second, maxRecovery: 8 * time.Second}, modes[:2], []result{
		{Mode: "naive", Single: singleCounts{3, 9, 27}, Sustained: sustainedStats{Requests: 100, Amplification: 27, P50MS: 980, P99MS: 1200}, RecoveryMS: 100},
		{Mode: "one-retry", Single: singleCounts{2, 4, 8}, RecoveryMS: -1},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"3 / 9 / 27", "27.00", "1200 ms", "2 / 4 / 8", "> 8000 ms"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--modes", "naive,nope"},
		{"--users", "0"},
		{"--duration", "0s"},
		{"--flaky", "1.5"},
		{"--chart", "out.gif"},
		{"extra"},
		{"serve", "--tier", "nope"},
		{"serve", "--tier", "order"},
		{"serve", "--tier", "payment", "--next", "127.0.0.1:1"},
		{"load"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(ctxT(t, 10*time.Second), args, &stdout, &stderr); err == nil {
			t.Errorf("run(%q): got no error", args)
		}
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
