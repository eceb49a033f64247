package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/plotter"
)

// TestDefaultWritesNoChart: a run without --chart writes nothing into the
// current directory and mentions no chart.
func TestDefaultWritesNoChart(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	var stdout, stderr bytes.Buffer
	err := run(ctxT(t, 60*time.Second), []string{
		"--modes", "tiered", "--users", "2", "--duration", "150ms", "--max-recovery", "1s",
	}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v (stderr %q)", err, stderr.String())
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("the default run wrote %d files into the current directory, first %q; want none", len(entries), entries[0].Name())
	}
	if strings.Contains(stdout.String(), "chart") {
		t.Fatalf("the default run mentions a chart:\n%s", stdout.String())
	}
}

// series makes a cumulative sample series with a constant rate.
func series(rate float64, d time.Duration) []sample {
	var s []sample
	for t := time.Duration(0); t <= d; t += sampleEvery {
		s = append(s, sample{t: t, calls: int64(rate * t.Seconds())})
	}
	return s
}

// TestChartPanels: one panel per mode, each titled with the mode and what
// its sustained open loop and its closed-loop users cost payment, the key
// of the marks once at the top, and no legend (a legend would repeat
// every mode's name).
func TestChartPanels(t *testing.T) {
	open := func(perSecond, perRequest float64) phaseStats {
		return phaseStats{Rate: 200, CallsPerSecond: perSecond, Amplification: perRequest}
	}
	users := func(perRequest float64) phaseStats { return phaseStats{Users: 32, Amplification: perRequest} }
	rs := []result{
		{Mode: "naive", Sustained: open(5400, 27), ClosedLoop: users(27), series: series(1000, 3*time.Second), usersAt: 2 * time.Second, restartAt: 2500 * time.Millisecond},
		{Mode: "tiered", Sustained: open(600, 3), ClosedLoop: users(3), series: series(300, 3*time.Second), usersAt: 2 * time.Second, restartAt: 2500 * time.Millisecond},
		{Mode: "stormguard", Sustained: open(49, 0.24), ClosedLoop: users(0.004), series: series(5, 3*time.Second), usersAt: 2 * time.Second, restartAt: 2600 * time.Millisecond},
	}
	path := filepath.Join(t.TempDir(), "chart.svg")
	if err := writeChart(path, "the title", "payment killed", "payment restarted", "then 200 req/s", "32 users start", rs); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	svg := string(b)
	for _, want := range []string{
		"naive: 5400 calls/s at payment from 200 req/s, 27.00 per request; 32 users: 27.00 per request",
		"tiered: 600 calls/s at payment from 200 req/s, 3.00 per request; 32 users: 3.00 per request",
		"stormguard: 49 calls/s at payment from 200 req/s, 0.24 per request; 32 users: 0.00 per request",
		"the title",
		"dashed line at 0: payment killed; then 200 req/s; dotted line: 32 users start; triangle: payment restarted",
	} {
		if n := strings.Count(svg, want); n != 1 {
			t.Errorf("%q appears %d times in the chart, want once", want, n)
		}
	}
	for _, mode := range []string{"naive", "tiered", "stormguard"} {
		if n := strings.Count(svg, ">"+mode+"<"); n != 0 {
			t.Errorf("a legend entry %q: found %d, want none", mode, n)
		}
	}
	if err := writeChart(path, "t", "a", "b", "c", "d", nil); err == nil {
		t.Error("a chart of no mode: got no error")
	}
}

// TestRatesShortInterval: calls per second per sampling interval, without
// the last, short one: 13 calls in 5 ms are not 2600 calls a second.
func TestRatesShortInterval(t *testing.T) {
	ms := time.Millisecond
	got := rates([]sample{{0, 0}, {100 * ms, 100}, {200 * ms, 250}, {205 * ms, 263}})
	want := plotter.XYs{{X: 0.05, Y: 1000}, {X: 0.15, Y: 1500}}
	if len(got) != len(want) {
		t.Fatalf("rates: got %v, want %v", got, want)
	}
	for i := range want {
		if math.Abs(got[i].X-want[i].X) > 1e-9 || math.Abs(got[i].Y-want[i].Y) > 1e-6 {
			t.Errorf("rates[%d]: got %v, want %v", i, got[i], want[i])
		}
	}
}
