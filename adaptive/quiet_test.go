package adaptive

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

// A client at every rate from 1 to 1000 requests/s, to a target that
// fails 10 % or 30 % of attempts at random behind a ready connection,
// with up to three attempts per call and no backoff: the throttle never
// marks the target down, refuses (almost) no first attempt, and the users
// get at least what retries off gives them, and at 30 % at least 83 %.
// Review finding 1: one failure 50 ms after the last accept marked a
// quiet client's target down, and a probe needed 20 refused requests:
// 52 % to 81 % of requests refused below 20 requests/s.
func TestQuietClientRandomFailures(t *testing.T) {
	for _, tc := range []struct {
		rate, fail float64
	}{{1, 0.1}, {1, 0.3}, {10, 0.1}, {10, 0.3}, {50, 0.1}, {50, 0.3}, {1000, 0.1}, {1000, 0.3}} {
		clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		r := rand.New(rand.NewPCG(1, 2))
		th, err := New(Config{Clock: clk, Rand: r.Float64})
		if err != nil {
			t.Fatal(err)
		}
		gap := float64(time.Second) / tc.rate
		const n = 20000
		refused, served := 0, 0
		for range n {
			clk.Advance(time.Duration(r.ExpFloat64() * gap))
			for a := range 3 {
				p, err := th.Allow(a > 0)
				if err != nil {
					if a == 0 {
						refused++
					}
					break
				}
				if r.Float64() >= tc.fail {
					p.Done(Accept)
					served++
					break
				}
				p.Done(Overload)
			}
		}
		s := th.Stats()
		success := float64(served) / n
		t.Logf("%4.0f/s, %2.0f %%: success %.2f %%, refused %d, downs %d", tc.rate, 100*tc.fail, 100*success, refused, s.Downs)
		if float64(refused) > 0.001*n {
			t.Errorf("%.0f/s, %.0f %% random failures: %d of %d requests refused (%d downs), want at most 0.1 %%", tc.rate, 100*tc.fail, refused, n, s.Downs)
		}
		want := 1 - tc.fail // retries off
		if tc.fail == 0.3 {
			want = 0.83
		}
		if success < want {
			t.Errorf("%.0f/s, %.0f %% random failures: success %.4f, want >= %.2f", tc.rate, 100*tc.fail, success, want)
		}
	}
}

// markDownByRun reports downRun failures one second apart after an
// accept, as a quiet client at a dead target behind a ready connection
// does, and reports whether the target was down only after the last.
func markDownByRun(th *Throttle, clk *clock.Fake) bool {
	attempt(th, false, Accept)
	for range downRun {
		if th.Down() {
			return false
		}
		clk.Advance(time.Second)
		attempt(th, false, Overload)
	}
	return th.Down()
}

// Behind a ready connection a quiet client's target is down after
// downRun failures in a row, not at the first; with the connection
// broken, the first failure after DownAfter without an accept is enough.
func TestDownEvidence(t *testing.T) {
	th, clk := newTest(t, Config{})
	if !markDownByRun(th, clk) {
		t.Fatalf("want down exactly at failure %d in a row, one second apart", downRun)
	}
	th2, clk2 := newTest(t, Config{})
	attempt(th2, false, Accept)
	clk2.Advance(time.Second)
	th2.Connectivity(false)
	attempt(th2, false, Overload)
	if !th2.Down() {
		t.Fatal("not down at a failure with the connection broken, a second after the last accept")
	}
	// Broken, with an accept 1 ms ago: down at once, since no attempt
	// can be accepted before the connection is back (waiting DownAfter
	// would only fill the window with failures), and its coming back
	// revives the target.
	th3, clk3 := newTest(t, Config{})
	attempt(th3, false, Accept)
	clk3.Advance(ms)
	th3.Connectivity(false)
	attempt(th3, false, Overload)
	if !th3.Down() {
		t.Fatal("not down at a failure with the connection broken, 1 ms after the last accept")
	}
	th3.Connectivity(true)
	if th3.Down() {
		t.Fatal("not revived when the connection came back")
	}
	// Behind a ready connection a failure 1 ms after an accept is not
	// evidence (once the revived target accepted: see
	// TestProbationAfterConnectivityRevival).
	attempt(th3, false, Accept)
	clk3.Advance(ms)
	attempt(th3, false, Overload)
	if th3.Down() {
		t.Fatal("down at a lone failure behind a ready connection")
	}
}

// A client too quiet to see each change of its channel: a failure run
// that saw the channel broken, then ready (a health trial), then failed
// again and marked the target down, is revived the next time the channel
// is seen ready; a run with no break in it is not.
func TestBrokenRememberedDuringRun(t *testing.T) {
	th, clk := newTest(t, Config{})
	attempt(th, false, Accept)
	clk.Advance(time.Second)
	th.Connectivity(false)
	attempt(th, false, Overload) // down at once: broken
	th.Connectivity(true)        // revived
	if th.Down() {
		t.Fatal("not revived")
	}
	// Cold replica: the same, from no accept at all.
	th2, clk2 := newTest(t, Config{})
	th2.Connectivity(false)
	for range minColdRun - 1 {
		attempt(th2, false, Overload)
		clk2.Advance(ms)
	}
	if th2.Down() {
		t.Fatal("cold target down before minColdRun failures")
	}
	clk2.Advance(time.Second)
	th2.Connectivity(true) // ready again, in the same run of failures
	attempt(th2, false, Overload)
	if !th2.Down() {
		t.Fatal("cold target not down after minColdRun failures over DownAfter")
	}
	th2.Connectivity(true)
	if th2.Down() {
		t.Fatal("a run that saw the channel broken was not revived by it being ready")
	}
	// An accept ends the run and the memory of the break.
	attempt(th2, false, Accept)
	clk2.Advance(time.Second)
	for range downRun {
		attempt(th2, false, Overload)
	}
	if !th2.Down() {
		t.Fatal("not down after downRun failures behind a ready connection")
	}
	th2.Connectivity(true)
	if !th2.Down() {
		t.Fatal("revived by a channel that never broke in this run")
	}
}

// A client that sees no accept within DownAfter retries a lone failure
// only; a busy one, with accepts between its attempts, up to retryRun.
func TestQuietRetry(t *testing.T) {
	th, clk := newTest(t, Config{})
	attempt(th, false, Accept)
	clk.Advance(time.Second)
	attempt(th, false, Overload)
	if !th.RetryAllowed() {
		t.Fatal("retry of a lone failure refused")
	}
	if !attempt(th, true, Overload) {
		t.Fatal("retry of a lone failure refused by Allow")
	}
	if th.RetryAllowed() {
		t.Error("RetryAllowed after two failures in a row and nothing accepted for a second")
	}
	if _, err := th.Allow(true); !errors.Is(err, ErrThrottled) {
		t.Errorf("second retry of a quiet client: got %v, want ErrThrottled", err)
	}
	// Busy: an accept 10 ms ago, then failures in a row.
	th2, clk2 := newTest(t, Config{})
	attempt(th2, false, Accept)
	clk2.Advance(10 * ms)
	for i := 1; i < retryRun; i++ {
		attempt(th2, i > 1, Overload)
		if !th2.RetryAllowed() {
			t.Fatalf("busy client: retry refused after %d failures in a row, 10 ms after an accept", i)
		}
	}
}

// The silence that makes a client quiet ends at its last failure: a
// backoff waited between RetryAllowed and Allow does not add to it. A
// client sending one call after another, whose target failed twice right
// after an accept, was allowed its second retry before the backoff and
// refused it after (in a third of such calls, from a new-user trial).
func TestQuietRetryAfterBackoff(t *testing.T) {
	th, clk := newTest(t, Config{})
	attempt(th, false, Accept)
	clk.Advance(ms)
	attempt(th, false, Overload)
	attempt(th, true, Overload)
	if !th.RetryAllowed() {
		t.Fatal("second retry refused 1 ms after an accept")
	}
	clk.Advance(100 * ms) // the backoff before the second retry
	if _, err := th.Allow(true); err != nil {
		t.Fatalf("second retry after its backoff: %v, want allowed as before the wait", err)
	}
}

// A target down on a run of failures behind a ready connection may be a
// false alarm: its first probe is the first request after the jittered
// gap, and each later probe needs twice the credit of the one before, up
// to 1/ProbeRatio requests. So a false "down" costs a quiet client at
// most a request or two, and a dead target soon gets only ProbeRatio of
// the requests.
func TestEarlyProbes(t *testing.T) {
	th, clk := newTest(t, Config{})
	if !markDownByRun(th, clk) {
		t.Fatal("not down")
	}
	// One request per 100 ms (past the 25 to 75 ms gap): probes at the
	// 1st request, then after 2, 4, 8, 16, 20, 20 more.
	var gaps []int
	n := 0
	for len(gaps) < 7 && n < 1000 {
		clk.Advance(100 * ms)
		n++
		p, err := th.Allow(false)
		if err != nil {
			continue
		}
		if !p.Probe() {
			t.Fatal("permit while down is not a probe")
		}
		gaps = append(gaps, n)
		n = 0
		p.Done(Overload)
	}
	want := []int{1, 2, 4, 8, 16, 20, 20}
	for i := range want {
		if i >= len(gaps) || gaps[i] != want[i] {
			t.Fatalf("requests per probe: got %v, want %v", gaps, want)
		}
	}
	// A false alarm: the next probe is accepted and the target is up.
	th2, clk2 := newTest(t, Config{})
	if !markDownByRun(th2, clk2) {
		t.Fatal("not down")
	}
	clk2.Advance(time.Second)
	if !attempt(th2, false, Accept) || th2.Down() {
		t.Fatal("the first request after a run-down did not probe and bring the target back")
	}
	// Down with the connection broken: a whole credit from the start.
	th3, clk3 := newTest(t, Config{})
	attempt(th3, false, Accept)
	clk3.Advance(time.Second)
	th3.Connectivity(false)
	attempt(th3, false, Overload)
	for i := 1; i < 20; i++ {
		clk3.Advance(time.Second)
		if _, err := th3.Allow(false); err == nil {
			t.Fatalf("probe at request %d after a down with the connection broken, want the 20th", i)
		}
	}
	clk3.Advance(time.Second)
	if p, err := th3.Allow(false); err != nil || !p.Probe() {
		t.Fatalf("20th request: got %v, want a probe", err)
	}
}

// A connection reported broken and then carrying an accept works: a
// caller that reports the connection only on failures (the interceptor)
// must not leave a stale "broken" that would make the next random
// failure of a quiet client enough to mark the target down.
func TestAcceptClearsBroken(t *testing.T) {
	th, clk := newTest(t, Config{})
	attempt(th, false, Accept)
	clk.Advance(time.Second)
	th.Connectivity(false)
	clk.Advance(time.Second)
	attempt(th, false, Accept) // reconnected: an answer came
	clk.Advance(time.Second)
	attempt(th, false, Overload)
	if th.Down() {
		t.Fatal("down at one failure on a connection that carried an accept since it was seen broken")
	}
}

// Requests that became rare while the target was down (a tier above
// holds them back) probe it as the requests before the down would have,
// up to a probe per Window: a client sent 200 requests a second before
// its target was down, and 8 a second since, probes once a second, not
// once every 20 requests (2.5 s). A user's trial: a plain tier between
// two stormguard tiers dropped the "do not retry" answer, the tier above
// called it down and let 8 of the 730 requests a second through, and
// the tiers held each other shut for 1.25-3.75 s after payment was back.
// A client as quiet before as after probes as before: every 20 requests.
func TestProbeCreditFollowsRateBeforeDown(t *testing.T) {
	for _, tc := range []struct {
		name        string
		before      time.Duration // between requests before the down
		after       time.Duration // and after
		wantBetween time.Duration // between probes
	}{
		{"busy before, rare since", 5 * ms, 125 * ms, time.Second},
		{"quiet before and since", time.Second, time.Second, 20 * time.Second},
		// Rarer since than a Window: still every 20 requests (a review
		// found every request probing at one per 20 s).
		{"quiet before, rarer since", time.Second, 20 * time.Second, 400 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			th, clk := newTest(t, Config{})
			for range time.Second / tc.before {
				clk.Advance(tc.before)
				attempt(th, false, Accept)
			}
			th.Connectivity(false) // a whole credit per probe from the start
			clk.Advance(tc.before)
			attempt(th, false, Overload)
			if !th.Down() {
				t.Fatal("not down")
			}
			var probes []time.Duration
			start := clk.Now()
			for len(probes) < 4 {
				clk.Advance(tc.after)
				if p, err := th.Allow(false); err == nil {
					probes = append(probes, clk.Now().Sub(start))
					p.Done(Overload)
				}
				if clk.Now().Sub(start) > time.Minute+4*tc.wantBetween {
					t.Fatalf("probes in %v: %v, want 4, %v apart", clk.Now().Sub(start), probes, tc.wantBetween)
				}
			}
			for i := 1; i < len(probes); i++ {
				if gap := probes[i] - probes[i-1]; gap != tc.wantBetween {
					t.Errorf("probes at %v: %v apart, want %v", probes, gap, tc.wantBetween)
					break
				}
			}
		})
	}
}

// A request that asks again (AllowAgain: a caller held for the target,
// when the next probe may go) brings no probe credit a second time: the
// probes stay at ProbeRatio of the requests. A review found each held
// request counted twice, 0.10 probes per request at 50 requests/s.
func TestAllowAgainAddsNoCredit(t *testing.T) {
	th, clk := downBroken(t, Config{})
	const n = 2000
	probes := 0
	for range n { // 50 requests/s, each asking twice
		clk.Advance(20 * ms)
		p, err := th.AllowFor(false, "/svc/M")
		if err != nil {
			p, err = th.AllowAgain("/svc/M")
		}
		if err == nil {
			probes++
			p.Done(Overload)
		}
	}
	if got := float64(probes) / n; got < 0.045 || got > 0.055 {
		t.Errorf("%d probes in %d requests (%.3f), want ProbeRatio's 0.05", probes, n, got)
	}
	if s := th.Stats(); s.Refused+s.Probes != n {
		t.Errorf("refused %d + probes %d, want the %d requests, each counted once", s.Refused, s.Probes, n)
	}
}
