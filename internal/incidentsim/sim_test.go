package incidentsim

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/internal/clock"
)

func run(t *testing.T, sc Scenario, st Stack) *Result {
	t.Helper()
	r, err := Run(sc, st, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func stack(t *testing.T, name string) Stack {
	t.Helper()
	for _, st := range Stacks() {
		if st.Name == name {
			return st
		}
	}
	t.Fatalf("no stack %q", name)
	return Stack{}
}

// The simulation is deterministic: the same seed gives the same result.
func TestDeterministic(t *testing.T) {
	st := stack(t, "adaptive+budget")
	a, b := run(t, Outage(7), st), run(t, Outage(7), st)
	for i := range a.Slices {
		if a.Slices[i] != b.Slices[i] {
			t.Fatalf("slice %d: %+v then %+v", i, a.Slices[i], b.Slices[i])
		}
	}
}

// The simulator reproduces what the issue measured for the old stack and
// for no protection, so its numbers for the new one mean something.
func TestBaselines(t *testing.T) {
	if got := run(t, Outage(1), stack(t, "retries")).Window(3*s, 8*s).CallsPerRequest(); got < 2.8 {
		t.Errorf("retries, outage: %.3f calls/req, want about 3", got)
	}
	if got := run(t, Outage(1), stack(t, "budget+breaker")).Window(3*s, 4*s).CallsPerRequest(); got < 1.25 {
		t.Errorf("budget+breaker, first second of the outage: %.3f calls/req, want above 1.25 (the issue's finding)", got)
	}
	if got := run(t, Outage(1), stack(t, "off")).Recovery(8*s, 11*s); got != 0 {
		t.Errorf("off: recovery %v, want 0", got)
	}
}

// The targets of issue 13 that the adaptive throttle meets, over three
// seeds.
func TestAdaptiveTargets(t *testing.T) {
	st := stack(t, "adaptive+budget")
	for seed := uint64(1); seed <= 2; seed++ {
		r := run(t, Outage(seed), st)
		if got := r.Window(3*s, 4*s).CallsPerRequest(); got > 1.25 {
			t.Errorf("seed %d: first second of the outage: %.3f calls/req, want <= 1.25", seed, got)
		}
		if got := r.Window(3*s, 8*s).CallsPerRequest(); got > 0.10 {
			t.Errorf("seed %d: 5 s outage: %.3f calls/req, want <= 0.10", seed, got)
		}
		for _, d := range []time.Duration{5 * s, time.Duration(seed) * 10 * s} {
			r := run(t, Long(d, seed), st)
			if got := r.Recovery(3*s+d, 6*s+d); got < 0 || got > 200*time.Millisecond {
				t.Errorf("seed %d: outage of %v: 99 %% after %v, want <= 200ms", seed, d, got)
			}
		}
		r = run(t, ColdStart(seed), st)
		if got := r.Window(0, 5*s).CallsPerRequest(); got > 0.05 {
			t.Errorf("seed %d: cold start: %.3f calls/req, want <= 0.05", seed, got)
		}
		r = run(t, RandomFailures(0.1, seed), st)
		// 99.9 % is the most that 3 attempts give at 10 %: the noise of
		// 10 000 requests puts it at 99.87 to 99.93 %, with or without
		// protection. What the throttle must not do is refuse.
		if w := r.Window(0, 10*s); w.Success() < 0.998 || w.CallsPerRequest() > 1.12 || r.Refused != 0 {
			t.Errorf("seed %d: 10 %%: success %.4f calls %.3f refused %d, want >= 0.998, <= 1.12, 0", seed, w.Success(), w.CallsPerRequest(), r.Refused)
		}
		r = run(t, RandomFailures(0.3, seed), st)
		if w := r.Window(0, 10*s); w.Success() < 0.83 || w.CallsPerRequest() > 1.25 || r.Refused != 0 {
			t.Errorf("seed %d: 30 %%: success %.4f calls %.3f refused %d, want >= 0.83, <= 1.25, 0", seed, w.Success(), w.CallsPerRequest(), r.Refused)
		}
		r = run(t, Partial(seed), st)
		if w := r.Window(3*s, 5*s); w.CallsPerRequest() > 1.25 {
			t.Errorf("seed %d: partial loss: %.3f calls/req, want <= 1.25", seed, w.CallsPerRequest())
		}
		if got := r.Recovery(5*s, 8*s); got < 0 || got > 200*time.Millisecond {
			t.Errorf("seed %d: partial loss: 99 %% after %v, want <= 200ms", seed, got)
		}
		r = run(t, Hangs(seed), st)
		if got := r.Window(4*s, 8*s).CallsPerRequest(); got > 0.10 {
			t.Errorf("seed %d: hang, after the first deadline: %.3f calls/req, want <= 0.10", seed, got)
		}
	}
	// One request at a dead payment from a cold start: 3 attempts.
	r := run(t, OneRequest(1), st)
	if w := r.Window(0, 2*s); w.Users != 1 || w.Calls != 3 {
		t.Errorf("one request, cold: %d calls for %d users, want 3 for 1", w.Calls, w.Users)
	}
}

func TestReport(t *testing.T) {
	if testing.Short() {
		t.Skip("the report takes a few seconds")
	}
	var b bytes.Buffer
	if err := FleetTable(&b, 1); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "| 1000 |") {
		t.Errorf("fleet table without the 1000 row:\n%s", b.String())
	}
}

// The fleet of 1000 replicas at 1 req/s each. When payment's process is
// gone (a restart: the channels break), its calls fail on the replicas'
// channels and none reaches payment; the channels that reconnect bring it
// back within grpc-go's reconnect backoff. When payment refuses everything
// behind ready channels, a replica at 1 req/s needs eight failures in a
// row to call it down and retries the first of them, as it must at random
// failures (see adaptive/quiet.go): the trade-off of issue 13's review
// finding 1, bounded here at 1.25 calls per request (the retry of each
// replica's first failed request; about 4 requests each in the outage).
func TestFleet(t *testing.T) {
	st := stack(t, "adaptive+budget")
	sc := Fleet(1000, 10*s, 1)
	w := run(t, sc, st).Window(3*s, 7*s)
	if got := w.CallsPerRequest(); got > 1.25 {
		t.Errorf("1000 replicas, ready channels: %.3f calls/req, want <= 1.25", got)
	}
	sc.Faults[0].Restart = true
	r := run(t, sc, st)
	w = r.Window(3*s, 7*s)
	if w.Calls != 0 || w.Local == 0 {
		t.Errorf("1000 replicas, restart: %d calls at payment, %d failed on the channel; want 0 and some", w.Calls, w.Local)
	}
	if got := r.Recovery(7*s, 17*s); got < 0 || got > 5*s {
		t.Errorf("1000 replicas, restart: 99 %% after %v, want within 5 s", got)
	}
}

// With payment's health watched (it says NOT_SERVING on its own after a
// run of failures, and serves again on trial), every fleet size stays
// within 0.05 of the floor of one call per replica, whatever the seed,
// and is back within 200 ms of payment: the trials cost a few calls each,
// whatever the number of replicas, and a trial that is served reaches
// every replica's channel at once.
func TestFleetHealth(t *testing.T) {
	st := stack(t, "adaptive+budget")
	for _, n := range []int{1, 10, 100, 1000} {
		for seed := uint64(1); seed <= 3; seed++ {
			sc := Fleet(n, 10*s, seed)
			sc.Health = true
			r := run(t, sc, st)
			w := r.Window(3*s, 7*s)
			floor := float64(n) / float64(w.Users)
			if got := w.CallsPerRequest(); got > floor+0.05 || got > 1 {
				t.Errorf("%d replicas, seed %d: %.4f calls/req, want <= floor %.4f + 0.05", n, seed, got, floor)
			}
			if got := r.Recovery(7*s, 17*s); got < 0 || got > 200*time.Millisecond {
				t.Errorf("%d replicas, seed %d: 99 %% after %v, want within 200 ms", n, seed, got)
			}
		}
	}
}

// Payment's health never says NOT_SERVING at random failures or at a
// fifth of its capacity: the same users are served as without it.
func TestHealthInvisibleWhenServing(t *testing.T) {
	st := stack(t, "adaptive+budget")
	for _, sc := range []Scenario{RandomFailures(0.3, 1), RandomFailures(0.1, 1), Partial(1)} {
		plain := run(t, sc, st).Window(0, sc.Duration)
		sc.Health = true
		h := run(t, sc, st).Window(0, sc.Duration)
		if h != plain {
			t.Errorf("%s: with health %+v, without %+v; want the same", sc.Name, h, plain)
		}
	}
}

// Random failures stay invisible at every rate: a client at 1, 10 and 50
// requests/s (and 1000, in TestAdaptiveTargets) to a payment that fails
// 10 % or 30 % at random serves at least what retries off serves, at 30 %
// at least 83 %, and its throttle refuses at most 0.1 % of the requests
// (retries that the quiet rule refuses are counted apart: they are the
// third attempts of a client that saw two failures in a row). Review
// finding 1: before, a quiet client's target was down at each failure,
// and 52 % to 81 % of requests were refused below 20 requests/s.
func TestRandomFailuresEveryRate(t *testing.T) {
	var th *adaptive.Throttle
	base := stack(t, "adaptive+budget")
	st := base
	st.New = func(clk *clock.Fake, rnd func() float64) (Guard, error) {
		g, err := base.New(clk, rnd)
		th = g.Throttle
		return g, err
	}
	off := stack(t, "off")
	for _, rate := range []float64{1, 10, 50} {
		for _, f := range []float64{0.1, 0.3} {
			d := time.Duration(20000/rate) * time.Second
			sc := Scenario{Name: "quiet", Duration: d, Load: rate, Seed: 1,
				Faults: []Fault{{To: 2 * d, Kind: Random, Value: f}}}
			w, wo := run(t, sc, st).Window(0, d), run(t, sc, off).Window(0, d)
			want := wo.Success()
			if f == 0.3 {
				want = max(want, 0.83)
			}
			s := th.Stats()
			if w.Success() < want || float64(s.Shed+s.Refused) > 0.001*float64(w.Users) {
				t.Errorf("%.0f req/s, %.0f %%: success %.4f, requests refused %d of %d (%+v); want >= %.4f, <= 0.1 %%", rate, 100*f, w.Success(), s.Shed+s.Refused, w.Users, s, want)
			}
		}
	}
}

// The trade-off tables print every row; with one seed they are exact.
func TestTradeoffs(t *testing.T) {
	if testing.Short() {
		t.Skip("the tables take a few seconds")
	}
	var b bytes.Buffer
	if err := Tradeoffs(&b, 1); err != nil {
		t.Fatal(err)
	}
	// K = 3 at a fifth: 19.5 % before failures that come together (its
	// token bucket's bursts) kept retries for DownAfter (adaptive's
	// failingRun); 19.2 % (-0.39 pt) before a retry judged the window as
	// it is when it asks, not as the last outcome left it (with 10
	// replicas, +0.075 calls per request before).
	for _, want := range []string{"| 3 | 19.6 % | 19.4 % | -0.24 pt |", "| 0.05 | +0.036 | 50ms | +0.076 | 300ms |", "| 0.02 |", "| 0.10 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("tables lack %q:\n%s", want, b.String())
		}
	}
}
