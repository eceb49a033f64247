package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The tail scenario, short: retries only sends no hedge and one call per
// request; hedging (at the edge, and configured on every hop) wins some
// hedges against payment's slow answers, at a few per cent more calls,
// not one more per tier that hedges.
func TestTailScenario(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"--scenario", "tail", "--rate", "200", "--for", "2s", "--json"}
	if err := run(ctxT(t, 2*time.Minute), args, &stdout, &stderr); err != nil {
		t.Fatalf("run(%q): %v (stderr %q)", args, err, stderr.String())
	}
	var rows []tailRow
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatalf("--json output: %v\n%s", err, stdout.String())
	}
	if len(rows) != len(tailModes) {
		t.Fatalf("%d rows, want one per mode", len(rows))
	}
	for _, r := range rows {
		if r.Requests < 300 || r.Success < 0.99 || len(r.Slices) != 2 {
			t.Errorf("%s: %d requests, success %v, %d slices: want about 400, all served, 2 slices", r.Mode, r.Requests, r.Success, len(r.Slices))
		}
		switch r.Mode {
		case "retries":
			if r.HedgesSent != 0 || r.CallsPerRequest != 1 {
				t.Errorf("retries: %d hedges, %v calls per request; want none, 1", r.HedgesSent, r.CallsPerRequest)
			}
		default:
			if r.HedgesWon == 0 || r.CallsPerRequest > 1.15 {
				t.Errorf("%s: %d hedges won, %v calls at payment per request; want some won, at most 1.15", r.Mode, r.HedgesWon, r.CallsPerRequest)
			}
		}
	}
	stdout.Reset()
	if err := run(ctxT(t, 2*time.Minute), []string{"--scenario", "tail", "--rate", "50", "--for", "1s", "--modes", "retries"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if out := stdout.String(); !strings.Contains(out, "p99.9") || !strings.Contains(out, "retries") {
		t.Errorf("table:\n%s", out)
	}
	runFails(t, "--scenario", "tail", "--modes", "naive")
	runFails(t, "--scenario", "tail", "--users", "3")
}
