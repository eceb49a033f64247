package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// runSliced runs the demo with args and decodes its --json output.
func runSliced(t *testing.T, args ...string) sliced {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := run(ctxT(t, 2*time.Minute), append(args, "--json"), &stdout, &stderr); err != nil {
		t.Fatalf("run(%q): %v (stderr %q)", args, err, stderr.String())
	}
	var r sliced
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("--json output: %v\n%s", err, stdout.String())
	}
	return r
}

func columnOf(t *testing.T, r sliced, name string) column {
	t.Helper()
	for _, c := range r.Columns {
		if c.Mode == name {
			return c
		}
	}
	t.Fatalf("no column %q in %+v", name, r.Columns)
	return column{}
}

func TestScenarioFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--scenario", "nope"},
		{"--scenario", "long", "--rate", "5"},
		{"--scenario", "long", "--for", "-1s"},
		{"--scenario", "fleet", "--replicas", "0"},
		{"--scenario", "fleet", "--replicas", "2000"},
		{"--scenario", "fleet", "--replicas", "1,x"},
		{"--scenario", "outage", "--users", "3"},
		{"--scenario", "outage", "--chart", "x.svg"},
		{"--scenario", "outage", "--slice", "1ms"},
		{"--scenario", "outage", "--rate", "0"},
		{"--scenario", "partial", "--modes", "nope"},
		{"--scenario", "hang", "--replicas", "3"},
		{"--scenario", "slow", "--modes", "tiered"},
		{"--scenario", "slow", "--modes", "adaptive"}, // now recommended
		{"--scenario", "slow", "--rate", "0"},
		{"--scenario", "hang", "--users-for", "1s"},
		{"--replicas", "1"}, // kill does not read it
		{"--for", "1s"},     // nor this
		// From the review of 2026-12-05: phases that do not line up with
		// the slices (summaries shifted), a long outage shorter than the
		// table's rows, a zero given (read as the default), the default
		// --modes spelled out for a scenario with modes of its own.
		{"--scenario", "outage", "--healthy", "1.1s"},
		{"--scenario", "hang", "--for", "1s", "--slice", "300ms"},
		{"--scenario", "long", "--for", "1s"},
		{"--scenario", "overload", "--after", "0"},
		{"--scenario", "outage", "--for", "0s"},
		{"--scenario", "tail", "--modes", "naive,one-retry,budget,tiered,stormguard,recommended"},
	} {
		runFails(t, args...)
	}
}

// The long outage runs in the simulator: its numbers are exact for a
// seed, the same on every run, and show the targets of issue 13 (at most
// 0.10 calls per request while down, back within 200 ms) against retries
// without protection.
func TestLongScenario(t *testing.T) {
	a := runSliced(t, "--scenario", "long", "--for", "10s", "--seed", "3")
	b := runSliced(t, "--scenario", "long", "--for", "10s", "--seed", "3")
	if ja, _ := json.Marshal(a); true {
		if jb, _ := json.Marshal(b); !bytes.Equal(ja, jb) {
			t.Errorf("two runs with one seed differ:\n%s\n%s", ja, jb)
		}
	}
	ad := columnOf(t, a, "adaptive+budget")
	if got := ad.Incident.CallsPerRequest; got > 0.10 {
		t.Errorf("adaptive+budget: %v calls/request while down, want <= 0.10", got)
	}
	if ad.RecoveryMS < 0 || ad.RecoveryMS > 200 {
		t.Errorf("adaptive+budget: recovery %d ms, want 0 to 200", ad.RecoveryMS)
	}
	if got := columnOf(t, a, "retries").Incident.CallsPerRequest; got < 2.8 {
		t.Errorf("retries: %v calls/request while down, want about 3", got)
	}
	// The rows: 8 of 250 ms, the rest of the outage, 12 of 50 ms, the
	// rest of the 3 s after.
	if n := len(ad.Slices); n != 8+1+12+1 {
		t.Fatalf("%d rows, want 22", n)
	}
	if s := ad.Slices[8]; s.TMS != 4500 || s.WidthMS != 13000-100-4500 {
		t.Errorf("the long row: %+v", s)
	}
	if s := ad.Slices[21]; s.TMS != 13500 || s.WidthMS != 2500 {
		t.Errorf("the row after: %+v", s)
	}
}

// The fleet: one column per size, its floor, and the throttle within
// 0.05 of it for 10 replicas.
func TestFleetScenario(t *testing.T) {
	r := runSliced(t, "--scenario", "fleet", "--replicas", "1,10")
	if len(r.Columns) != 2 {
		t.Fatalf("%d columns, want 2", len(r.Columns))
	}
	for i, n := range []int{1, 10} {
		c := r.Columns[i]
		if c.Floor <= 0 || c.RestartRecoveryMS == nil || c.RecoveryMS < 0 {
			t.Errorf("%d replicas: floor %v, restart recovery %v, recovery %d", n, c.Floor, c.RestartRecoveryMS, c.RecoveryMS)
		}
		if got := c.Incident.CallsPerRequest; got > c.Floor+0.10 {
			t.Errorf("%d replicas: %v calls/request, floor %v", n, got, c.Floor)
		}
		if c.Health == nil || c.HealthRecoveryMS == nil {
			t.Fatalf("%d replicas: no health-watched result", n)
		}
		if got := c.Health.CallsPerRequest; got > c.Floor+0.05 || *c.HealthRecoveryMS < 0 || *c.HealthRecoveryMS > 200 {
			t.Errorf("%d replicas, health watched: %v calls/request (floor %v), back in %d ms; want <= floor + 0.05, <= 200 ms", n, got, c.Floor, *c.HealthRecoveryMS)
		}
	}
	if c := r.Columns[1]; c.Mode != "10 x 100/s" || c.Floor < 10.0/4400 || c.Floor > 10.0/3600 {
		t.Errorf("10 replicas: column %q floor %v, want 10 x 100/s, 10 / ~4000 requests", c.Mode, c.Floor)
	}
}

// The outage on the gRPC chain, short: what cannot depend on timing.
// tiered sends every request's three attempts at the dead payment;
// recommended's adaptive throttle, having seen healthy traffic, stops
// after the first failures. Only requests still in flight when payment is back can
// succeed: with 1.5 s down, more than half would need a stall of 750 ms.
func TestOutageScenario(t *testing.T) {
	r := runSliced(t, "--scenario", "outage", "--modes", "tiered,recommended", "--rate", "100",
		"--healthy", "250ms", "--for", "1500ms", "--after", "250ms", "--slice", "250ms")
	if len(r.Columns) != 2 {
		t.Fatalf("%d columns, want 2", len(r.Columns))
	}
	for _, c := range r.Columns {
		if len(c.Slices) != 8 {
			t.Errorf("%s: %d slices, want 8", c.Mode, len(c.Slices))
		}
		if c.Incident.Requests == 0 || c.Incident.Success >= 0.5 {
			t.Errorf("%s: %d requests in the outage, success %v: want some, mostly failed", c.Mode, c.Incident.Requests, c.Incident.Success)
		}
	}
	tiered, ad := columnOf(t, r, "tiered"), columnOf(t, r, "recommended")
	if ad.Incident.CallsPerRequest >= tiered.Incident.CallsPerRequest {
		t.Errorf("calls/request in the outage: recommended %v, tiered %v; want recommended fewer", ad.Incident.CallsPerRequest, tiered.Incident.CallsPerRequest)
	}
}

// The hang, short: requests that meet it are held until their deadline
// and fail (the hang lasts longer than the deadline); recommended's
// adaptive throttle, down after the first deadline (1 s into the 2 s hang), sends
// fewer calls than tiered, which sends one per request throughout.
func TestHangScenario(t *testing.T) {
	r := runSliced(t, "--scenario", "hang", "--modes", "tiered,recommended", "--rate", "100",
		"--healthy", "250ms", "--for", "2s", "--after", "250ms")
	tiered, ad := columnOf(t, r, "tiered"), columnOf(t, r, "recommended")
	for _, c := range []column{tiered, ad} {
		if len(c.Slices) != 10 || c.Incident.Requests == 0 || c.Incident.Success >= 0.5 {
			t.Errorf("%s: %d slices, %d requests in the hang, success %v: want 10, some, mostly failed", c.Mode, len(c.Slices), c.Incident.Requests, c.Incident.Success)
		}
	}
	if ad.Incident.CallsPerRequest >= tiered.Incident.CallsPerRequest {
		t.Errorf("calls/request in the hang: recommended %v, tiered %v; want recommended fewer", ad.Incident.CallsPerRequest, tiered.Incident.CallsPerRequest)
	}
}

// The slow dependency, short, with retries off: never more than one call
// at payment per user request.
func TestSlowScenario(t *testing.T) {
	r := runSliced(t, "--scenario", "slow", "--modes", "off", "--rate", "50",
		"--healthy", "250ms", "--for", "250ms", "--after", "250ms")
	c := columnOf(t, r, "off")
	if len(c.Slices) != 3 {
		t.Fatalf("%d slices, want 3", len(c.Slices))
	}
	reqs, calls := 0, 0.0
	for _, s := range c.Slices {
		reqs += s.Requests
		calls += s.CallsPerRequest * float64(s.Requests)
	}
	if reqs == 0 || calls > float64(reqs)+0.5 {
		t.Errorf("%d requests, %.0f calls at payment: want at most one each", reqs, calls)
	}
}

func TestSlicedTable(t *testing.T) {
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	r := sliced{Scenario: "outage", Title: "t", begin: 250 * time.Millisecond, end: 500 * time.Millisecond,
		Columns: []column{{Mode: "a", RecoveryMS: -1, Slices: []sliceStat{
			{TMS: 0, WidthMS: 250, Requests: 10, Success: 1, CallsPerRequest: 1},
			{TMS: ms(250 * time.Millisecond), WidthMS: 250, Requests: 4, Success: 0.25, CallsPerRequest: 2.5},
			{TMS: 500, WidthMS: 1000},
		}}},
		legend: []string{"a\tmode a"}}
	var out bytes.Buffer
	if err := writeSliced(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"100.0 % / 1.00", "0.25 *", "25.0 % / 2.50", "0.50-1.50", "- / -", "not in the run", "mode a"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
