package adaptive

import (
	"fmt"
	"testing"
	"time"
)

// A kind that fails everything beside one that is served: the served
// kind is never shed and the target never goes down, while the failing
// kind is shed as the target is. With one
// probability for all, the served kind was shed with the failing one (a
// user's trial: 16-39 % of a server's healthy unary calls while its watch
// failed, retries off 100 %).
func TestKindFailingAloneShedsOnlyItself(t *testing.T) {
	th, clk := newTest(t, Config{Rand: nil})
	draws := 0
	th.rand = func() float64 { draws++; return float64(draws%100) / 100 } // spread over [0, 1)
	for range 100 {                                                       // 1 s of healthy gets first
		p, err := th.AllowFor(false, "/svc/Get")
		if err != nil {
			t.Fatal(err)
		}
		p.Done(Accept)
		clk.Advance(10 * time.Millisecond)
	}
	sentWatch, watches := 0, 0
	for i := range 300 { // 3 s: 20 watch opens and one get every 10 ms
		for range 20 {
			watches++
			if p, err := th.AllowFor(false, "/svc/Watch"); err == nil {
				sentWatch++
				p.Done(Overload)
			}
		}
		p, err := th.AllowFor(false, "/svc/Get")
		if err != nil {
			t.Fatalf("get %d: %v, with the watch failing; want allowed (stats %+v)", i, err, th.Stats())
		}
		p.Done(Accept)
		if i == 150 && th.RetryAllowedFor("/svc/Watch") {
			t.Errorf("a retry of the watch allowed while it fails everything")
		}
		clk.Advance(10 * time.Millisecond)
	}
	st := th.Stats()
	if st.Downs != 0 {
		t.Errorf("%d downs, want none: the target serves its gets", st.Downs)
	}
	if sentWatch*2 > watches {
		t.Errorf("%d of %d watch opens sent, want them shed as the target is (under half)", sentWatch, watches)
	}
}

// A kind's probability is its own where that is lower than the
// target's, never higher (a kind that fails everything is shed as the
// target is); past maxKinds kinds in the window, another kind is shed
// as the target is.
func TestKindProbabilityBounded(t *testing.T) {
	th, clk := newTest(t, Config{})
	permits := map[int][]Permit{}
	for k := range maxKinds { // taken while the target is healthy
		for range 40 {
			p, err := th.AllowFor(false, fmt.Sprintf("k%d", k))
			if err != nil {
				t.Fatal(err)
			}
			permits[k] = append(permits[k], p)
		}
	}
	clk.Advance(time.Millisecond)
	for k := range maxKinds {
		for i, p := range permits[k] {
			if k%2 == 0 && i%4 == 0 {
				p.Done(Accept) // the even kinds: one in four accepted
			} else {
				p.Done(Overload) // the odd ones: none
			}
		}
	}
	if ok, err := th.AllowFor(false, "k0"); err == nil {
		ok.Done(Accept) // the run of failures ends with an accept
	}
	el := th.elapsed()
	th.mu.Lock()
	pt := th.probability(el)
	if pt == 0 {
		th.mu.Unlock()
		t.Fatal("setup: the target does not shed")
	}
	own := make([]float64, maxKinds)
	for k := range maxKinds {
		pk := th.kindProbability(el, fmt.Sprintf("k%d", k), pt)
		own[k] = pk
		switch {
		case k%2 == 0 && pk >= pt:
			t.Errorf("kind k%d, accepted one in four: %v with the target at %v, want less", k, pk, pt)
		case k%2 == 1 && pk != pt:
			t.Errorf("kind k%d, failing everything: %v with the target at %v, want the target's", k, pk, pt)
		}
	}
	if pk := th.kindProbability(el, "one more", pt); pk != pt {
		t.Errorf("a kind past %d: %v, want the target's %v", maxKinds, pk, pt)
	}
	th.mu.Unlock()
	// ProbabilityFor reports each kind's, as of the last outcome (which
	// the target's equals here), and 1 once the target is down.
	if st := th.Stats().Probability; st != pt {
		t.Fatalf("setup: Stats().Probability %v, want %v", st, pt)
	}
	for k, pk := range own {
		if got := th.ProbabilityFor(fmt.Sprintf("k%d", k)); got != pk {
			t.Errorf("ProbabilityFor(k%d) = %v, want %v", k, got, pk)
		}
	}
	if got := th.ProbabilityFor(""); got != pt {
		t.Errorf("ProbabilityFor(\"\") = %v, want the target's %v", got, pt)
	}
	failUntilDown(th, clk)
	if got := th.ProbabilityFor("k0"); got != 1 {
		t.Errorf("ProbabilityFor(k0) of a down target = %v, want 1", got)
	}
}

// The retry rules follow the kind: while the target sheds because one
// kind fails everything, a failure of a kind it serves is retried (at
// once: healthy), and one of the failing kind is not.
func TestKindRetryRules(t *testing.T) {
	th, clk := newTest(t, Config{})
	take := func(kind string, n int) []Permit {
		var ps []Permit
		for range n {
			p, err := th.AllowFor(false, kind)
			if err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
			ps = append(ps, p)
		}
		return ps
	}
	good, bad := take("good", 20), take("bad", 200) // taken while healthy
	clk.Advance(time.Millisecond)
	for _, p := range good {
		p.Done(Accept)
	}
	for _, p := range bad {
		p.Done(Overload)
	}
	take("good", 1)[0].Done(Accept) // the run of failures ends
	if th.RetryAllowed() {
		t.Fatal("setup: the target does not shed")
	}
	if !th.RetryAllowedFor("good") || !th.HealthyFor("good") {
		t.Error("a kind the target serves: its retry refused, or not healthy")
	}
	if th.RetryAllowedFor("bad") || th.HealthyFor("bad") {
		t.Error("a kind failing everything: its retry allowed, or healthy")
	}
}

// A healthy kind whose answers come more than a window after it asked
// (a slow method, a stream's first message), failing now and then at
// once, beside a fast kind, is not shed: a kind is never shed harder than
// the target (a review of a rule that shed a kind failing nearly
// everything on its own evidence: 1 % random failures shed 15.6 % of
// such a kind, 2 % 67.7 %).
func TestKindSlowAcceptsCount(t *testing.T) {
	th, clk := newTest(t, Config{})
	type pending struct {
		p  Permit
		at time.Duration
	}
	var queue []pending
	refused, asked := 0, 0
	for i := range 4000 { // 4 s, one call a millisecond, answered after 1.5 s
		now := time.Duration(i) * time.Millisecond
		for len(queue) > 0 && queue[0].at <= now {
			queue[0].p.Done(Accept)
			queue = queue[1:]
		}
		if p, err := th.AllowFor(false, "get"); err == nil {
			p.Done(Accept) // a fast kind the target serves
		}
		asked++
		p, err := th.AllowFor(false, "slow")
		if err != nil {
			refused++
		} else if i%50 == 0 {
			p.Done(Overload) // 2 % fail at once
		} else {
			queue = append(queue, pending{p, now + 1500*time.Millisecond})
		}
		clk.Advance(time.Millisecond)
	}
	if refused != 0 {
		t.Errorf("%d of %d calls of a slow, healthy kind refused at 2 %% random failures, want none", refused, asked)
	}
}

// oneKindScenario plays scenario name for a client of one kind (kind ""
// decides without kinds) and returns whether its next first attempt,
// drawn at u, is allowed, whether a retry is, and whether it is healthy,
// and the target's probability.
func oneKindScenario(t *testing.T, kind, name string, u float64) (decisions [3]bool, pt float64) {
	th, clk := newTest(t, Config{})
	take := func(n int) []Permit {
		var ps []Permit
		for range n {
			p, err := th.AllowFor(false, kind)
			if err != nil {
				t.Fatalf("%s/%q: setup refused: %v", name, kind, err)
			}
			ps = append(ps, p)
		}
		return ps
	}
	switch name {
	case "cleared": // the window forgotten after DownAfter of accepts
		ps := take(40)
		clk.Advance(time.Millisecond)
		for i, p := range ps {
			if i%5 == 0 {
				p.Done(Accept)
			} else {
				p.Done(Overload)
			}
		}
		clk.Advance(60 * time.Millisecond)
		for _, p := range take(3) {
			p.Done(Accept) // fresh = 3, DownAfter after the last failure: target window emptied
		}
		clk.Advance(time.Millisecond)
		for _, p := range take(12) {
			p.Done(Overload)
		}
	case "revived", "revived-retry": // back up: setUp empties the target's window
		ps := take(40)
		clk.Advance(time.Millisecond)
		for _, p := range ps {
			p.Done(Accept)
		}
		clk.Advance(100 * time.Millisecond)
		for !th.Down() {
			p, err := th.AllowFor(false, kind)
			if err == nil {
				p.Done(Overload)
			}
			clk.Advance(5 * time.Millisecond)
		}
		for th.Down() {
			clk.Advance(10 * time.Millisecond)
			if p, err := th.AllowFor(false, kind); err == nil {
				p.Done(Accept)
			}
		}
		n, every := 12, 100
		if name == "revived-retry" {
			n, every = 16, 4
		}
		for i, p := range take(n) {
			if i%every == every-1 {
				p.Done(Accept)
			} else {
				p.Done(Overload)
			}
		}
	case "silences": // silences counted together (n > 1)
		ps := take(35)
		clk.Advance(time.Millisecond)
		for _, p := range ps[10:] {
			p.Done(Overload)
		}
		for _, p := range ps[:10] {
			p.Done(Accept) // latency 1 ms; the run ends
		}
		clk.Advance(time.Millisecond)
		first := take(5)
		clk.Advance(2 * time.Millisecond)
		for _, p := range first {
			p.Done(Silence) // within DownAfter of the first: not counted yet
		}
		clk.Advance(25 * time.Millisecond)
		take(1)[0].Done(Overload) // a failure meanwhile: the window is not forgotten
		clk.Advance(25 * time.Millisecond)
		last := take(1)
		clk.Advance(2 * time.Millisecond)
		last[0].Done(Silence) // n = 6
		if th.Down() {
			t.Fatalf("setup: down")
		}
	}
	th.mu.Lock()
	pt = th.probability(th.elapsed())
	th.mu.Unlock()
	decisions[1], decisions[2] = th.RetryAllowedFor(kind), th.HealthyFor(kind)
	th.rand = fixedRand(u)
	_, err := th.AllowFor(false, kind)
	decisions[0] = err == nil
	return decisions, pt
}

// A client of one kind decides exactly as without kinds: first attempts,
// retries and the retry-at-once rule, after the target's window was
// forgotten, after the target came back up, and after silences counted
// together (a review: the kinds' windows kept past the target's let
// such a client retry at once into a target just back up and failing
// again; silences counted for the target only, and trials counted for no
// kind, shed it less).
func TestOneKindDecidesAsTarget(t *testing.T) {
	for _, c := range []struct {
		name string
		u    float64
	}{{"cleared", 0.5}, {"revived", 0.5}, {"revived-retry", 0.5}, {"silences", 0.2}} {
		before, pb := oneKindScenario(t, "", c.name, c.u)
		now, pn := oneKindScenario(t, "/svc/Only", c.name, c.u)
		if before != now || pb != pn {
			t.Errorf("%s: without kinds (allow, retry, healthy) %v at p %.3f; one kind %v at p %.3f", c.name, before, pb, now, pn)
		}
	}
}

// With several kinds, the kinds' windows outlast the target's: after a
// short down that a kind failing everything caused (a pause of the
// served kind's calls), the served kind's window still says it is
// served, and the failing kind's next burst does not shed it (a user's
// trial, the windows emptied at each of 5-7 downs: 24-75 % of the unary
// calls served beside a failing watch, 100 % kept).
func TestKindWindowsOutlastADown(t *testing.T) {
	th, clk := newTest(t, Config{})
	call := func(kind string, o Outcome) error {
		p, err := th.AllowFor(false, kind)
		if err == nil {
			p.Done(o)
		}
		return err
	}
	for range 50 { // healthy gets, 10 ms apart
		if err := call("get", Accept); err != nil {
			t.Fatal(err)
		}
		clk.Advance(10 * time.Millisecond)
	}
	for !th.Down() { // the gets pause; the watch fails everything
		_ = call("watch", Overload)
		clk.Advance(5 * time.Millisecond)
	}
	for th.Down() { // a get probes and is served: back up
		clk.Advance(10 * time.Millisecond)
		_ = call("get", Accept)
	}
	for range 20 { // the watch's next burst
		_ = call("watch", Overload)
	}
	if err := call("get", Accept); err != nil {
		t.Fatalf("a get after the down, beside the watch's burst: %v, want allowed (%+v)", err, th.Stats())
	}
}

// A kind failing everything beside kinds the target serves, at a share
// too small to make the target shed: its first attempts go out as the
// target's say, its retries do not (a user's trial: 3.0 calls at payment
// per request of such a method, retries off 1.0).
func TestKindFailingIsNotRetried(t *testing.T) {
	th, clk := newTest(t, Config{})
	for range 100 { // per 10 ms: ten served calls of other kinds, one of the failing
		for k := range 10 {
			if p, err := th.AllowFor(false, fmt.Sprintf("ok%d", k%4)); err == nil {
				p.Done(Accept)
			}
		}
		p, err := th.AllowFor(false, "bad")
		if err != nil {
			t.Fatalf("a first attempt of the failing kind: %v, want sent as the target says", err)
		}
		p.Done(Overload)
		clk.Advance(10 * time.Millisecond)
	}
	if th.Stats().Probability != 0 {
		t.Fatalf("setup: the target sheds (%v)", th.Stats().Probability)
	}
	if _, err := th.AllowFor(true, "bad"); err == nil || th.RetryAllowedFor("bad") || th.HealthyFor("bad") {
		t.Errorf("a retry of a kind failing everything: allowed (%v), RetryAllowedFor %v, HealthyFor %v; want refused", err, th.RetryAllowedFor("bad"), th.HealthyFor("bad"))
	}
	if _, err := th.AllowFor(true, "ok1"); err != nil || !th.RetryAllowedFor("ok1") {
		t.Errorf("a retry of a served kind: %v, RetryAllowedFor %v; want allowed", err, th.RetryAllowedFor("ok1"))
	}
}

// One kind decides as without kinds after busy answers whose accepts
// aged out of the window (a review: HealthyFor's lock-free path read the
// kind's window without the forget rule that RetryAllowedFor applies).
func TestOneKindBusyAgedDecidesAsTarget(t *testing.T) {
	run := func(kind string) (healthy, retry bool) {
		th, clk := newTest(t, Config{})
		for range 30 { // bucket 0: 30 accepts
			p, err := th.AllowFor(false, kind)
			if err != nil {
				t.Fatal(err)
			}
			p.Done(Accept)
		}
		clk.Advance(500 * time.Millisecond)
		for range 20 { // 20 busy answers: p = 0 at each (50 req, 30 acc)
			p, err := th.AllowFor(false, kind)
			if err != nil {
				t.Fatal(err)
			}
			p.Done(Busy)
		}
		clk.Advance(550 * time.Millisecond) // the accepts age out
		h := th.HealthyFor(kind)
		return h, th.RetryAllowedFor(kind)
	}
	h0, r0 := run("")
	h1, r1 := run("/svc/Only")
	if h0 != h1 || r0 != r1 {
		t.Errorf("without kinds healthy=%v retry=%v; one kind healthy=%v retry=%v", h0, r0, h1, r1)
	}
}

// A kind answered busy (admission control) beside a served kind is not a
// kind that fails: its retries and hedges go as the target's rules say
// (a review: counted as failing, they were refused).
func TestKindBusyIsRetried(t *testing.T) {
	th, clk := newTest(t, Config{})
	for range 100 {
		for range 3 {
			p, _ := th.AllowFor(false, "ok")
			p.Done(Accept)
		}
		p, _ := th.AllowFor(false, "heavy")
		p.Done(Busy)
		clk.Advance(10 * time.Millisecond)
	}
	if p := th.Stats().Probability; p != 0 {
		t.Fatalf("setup: target p %v", p)
	}
	if !th.RetryAllowedFor("heavy") || !th.HealthyFor("heavy") {
		t.Errorf("busy kind, target healthy: RetryAllowedFor %v HealthyFor %v, want true", th.RetryAllowedFor("heavy"), th.HealthyFor("heavy"))
	}
	if _, err := th.AllowFor(true, "heavy"); err != nil {
		t.Errorf("retry (or hedge) of the busy kind: %v", err)
	}
}

// Three accepts forget a busy loss: the target forgets it, and the busy
// kind's retries go too.
func TestKindBusyForgottenWithTarget(t *testing.T) {
	th, clk := newTest(t, Config{})
	clk.Advance(60 * time.Millisecond)
	for range 3 { // three accepts, no overload failure for DownAfter
		p, _ := th.AllowFor(false, "ok")
		p.Done(Accept)
	}
	for range 30 { // heavy: busy; each time p > 0 the target forgets
		p, err := th.AllowFor(false, "heavy")
		if err != nil {
			t.Fatal(err)
		}
		p.Done(Busy)
	}
	if !th.RetryAllowed() {
		t.Fatalf("setup: the target has not forgotten the busy loss")
	}
	if !th.RetryAllowedFor("heavy") {
		t.Errorf("the target forgot the busy loss (three accepts), the busy kind's retry still refused")
	}
}
