package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// TestChartPanels: one panel per mode, each titled with the mode, the key
// of the marks once at the top, and no legend (a legend would repeat every
// mode's name).
func TestChartPanels(t *testing.T) {
	rs := []result{
		{Mode: "naive", Sustained: sustainedStats{Amplification: 27}, series: series(1000, 3*time.Second), restartAt: 2500 * time.Millisecond},
		{Mode: "tiered", Sustained: sustainedStats{Amplification: 3}, series: series(300, 3*time.Second), restartAt: 2500 * time.Millisecond},
		{Mode: "stormguard", Sustained: sustainedStats{Amplification: 0.03}, series: series(5, 3*time.Second), restartAt: 2600 * time.Millisecond},
	}
	path := filepath.Join(t.TempDir(), "chart.svg")
	if err := writeChart(path, "the title", "payment killed", "payment restarted", rs); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	svg := string(b)
	for _, want := range []string{
		"naive: 27.00 calls at payment per user request",
		"tiered: 3.00 calls at payment per user request",
		"stormguard: 0.03 calls at payment per user request",
		"the title",
		"dashed line at 0: payment killed; triangle: payment restarted",
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
	if err := writeChart(path, "t", "a", "b", nil); err == nil {
		t.Error("a chart of no mode: got no error")
	}
}
