package adaptive

import (
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

// A retry, and the look at whether a failure was a lone one, judge the
// window as it is when they ask, with or without a kind: accepts that
// aged out of the window since the last outcome no longer count. Before,
// a retry without a kind and Healthy read the word of the last outcome,
// so that Allow(true) let a retry go that RetryAllowed refused, and a
// client of one kind ("") decided otherwise than one of a named kind (a
// review's reproduction).
func TestRetryJudgesTheWindowAsItIsNow(t *testing.T) {
	for _, kind := range []string{"", "/svc/Only"} {
		th, clk := newTest(t, Config{})
		outcome := func(o Outcome) {
			t.Helper()
			p, err := th.AllowFor(false, kind)
			if err != nil {
				t.Fatalf("kind %q: first attempt refused: %v", kind, err)
			}
			p.Done(o)
		}
		for range 30 {
			outcome(Accept)
		}
		clk.Advance(980 * time.Millisecond)
		outcome(Overload)
		for range 9 {
			outcome(Busy)
		}
		// The 30 accepts leave the window; no outcome comes meanwhile.
		clk.Advance(70 * time.Millisecond)
		if th.RetryAllowedFor(kind) {
			t.Fatalf("kind %q: RetryAllowedFor true with no accept among the window's 10 requests", kind)
		}
		if _, err := th.AllowFor(true, kind); err == nil {
			t.Errorf("kind %q: AllowFor(true) let a retry go that RetryAllowedFor refuses", kind)
		}
		if th.HealthyFor(kind) {
			t.Errorf("kind %q: HealthyFor true with no accept among the window's 10 requests", kind)
		}
	}
}

// An outcome whose caller read the clock a window or more before it got
// the lock (a goroutine that did not run for a moment) finds its bucket's
// slot holding a newer time: it counts there, and the newer outcomes
// stay. Before, the slot was emptied for the old time, out of the window
// anyway, and the newer outcomes were lost (a review's reproduction:
// twenty outcomes of the current window gone for one late accept).
func TestLateOutcomeKeepsNewerBucket(t *testing.T) {
	var bs [numBuckets]bucket
	const width = int64(100 * time.Millisecond)
	newer := bucketAt(&bs, numBuckets*width+5, width) // a window later, same slot
	newer.req, newer.acc = 20, 20
	late := bucketAt(&bs, 5, width)
	late.req++
	late.acc++
	if late != newer || newer.idx != numBuckets || newer.req != 21 || newer.acc != 21 {
		t.Fatalf("slot after the late outcome: %+v (the same bucket: %v), want idx %d with 21 requests and accepts", *newer, late == newer, numBuckets)
	}
	// An older time in the slot is still emptied for the newer one.
	next := bucketAt(&bs, 2*numBuckets*width, width)
	if next.idx != 2*numBuckets || next.req != 0 {
		t.Fatalf("slot a window later: %+v, want emptied for idx %d", *next, 2*numBuckets)
	}
}

// Silences counted together count each for its own kind: nine of a kind
// that hangs and the one of another kind whose silence made them count
// (DownAfter after the first) go to their own windows. Before, all ten
// went to the kind of the last one, which then read as failing (its
// retries refused for up to a window after a revival) while the kind
// that hung read as served (a review's reproduction).
func TestSilencesCountForTheirKind(t *testing.T) {
	th, clk := newTest(t, Config{})
	for _, k := range []string{"A", "B"} {
		p, err := th.AllowFor(false, k)
		if err != nil {
			t.Fatal(err)
		}
		p.Done(Accept)
	}
	clk.Advance(100 * time.Millisecond)
	for range 9 {
		p, err := th.AllowFor(false, "A")
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Millisecond)
		p.Done(Silence)
	}
	clk.Advance(60 * time.Millisecond)
	p, err := th.AllowFor(false, "B")
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Millisecond)
	p.Done(Silence)
	th.mu.Lock()
	el := th.elapsed()
	req := func(kind string) int64 {
		k := th.kindFor(kind, el, false)
		if k == nil {
			return -1
		}
		return sumOf(&k.buckets, el, th.width).req
	}
	a, b := req("A"), req("B")
	target := sumOf(&th.buckets, el, th.width).req
	th.mu.Unlock()
	if a != 10 || b != 2 || target != 12 {
		t.Fatalf("requests in the windows: A %d, B %d, target %d; want 10 (1 accepted, 9 silent), 2 (1 and 1), 12", a, b, target)
	}
}

// A look at the window that forgets it (every attempt accepted for
// DownAfter: see probability) forgets it for everyone. Before, a retry's
// or a failure's look (RetryAllowedFor, HealthyFor) emptied the buckets
// but left the published probability as the last outcome set it, so that
// Stats and ProbabilityFor read p > 0 for a target that sheds nothing,
// until the next Allow (a review).
func TestLookThatForgetsPublishes(t *testing.T) {
	for name, look := range map[string]func(*Throttle) bool{
		"RetryAllowed": (*Throttle).RetryAllowed,
		"Healthy":      (*Throttle).Healthy,
	} {
		th, clk := newTest(t, Config{Rand: fixedRand(0.99)})
		for range 12 {
			attempt(th, false, Busy)
		}
		for range minFresh {
			attempt(th, false, Accept)
		}
		if p := th.Stats().Probability; p == 0 {
			t.Fatalf("%s: setup: probability 0 after 12 busy answers and %d accepts", name, minFresh)
		}
		clk.Advance(DefaultDownAfter + 10*time.Millisecond)
		if !look(th) {
			t.Fatalf("%s: false once the window is forgotten", name)
		}
		if p := th.Stats().Probability; p != 0 {
			t.Errorf("%s: Stats().Probability %.3f after the window was forgotten, want 0", name, p)
		}
		if p := th.ProbabilityFor(""); p != 0 {
			t.Errorf("%s: ProbabilityFor %.3f after the window was forgotten, want 0", name, p)
		}
	}
}

// lockClock is a fake clock that notes each read made while its
// throttle's lock is held.
type lockClock struct {
	*clock.Fake
	th    *Throttle
	under int
}

func (c *lockClock) Now() time.Time {
	if c.th != nil {
		if c.th.mu.TryLock() {
			c.th.mu.Unlock()
		} else {
			c.under++
		}
	}
	return c.Fake.Now()
}

// The clock is read with no lock held, as Config.Clock says: a clock that
// calls back into the throttle (one that reports what it is asked, a
// test's that advances itself) does not deadlock. Before, emptying the
// kinds' windows read it under the lock (a review).
func TestClockReadWithoutLock(t *testing.T) {
	clk := &lockClock{Fake: clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	th, err := New(Config{Clock: clk, Rand: fixedRand(0.99), DownAfter: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	clk.th = th
	for _, kind := range []string{"A", "B", "A"} {
		p, err := th.AllowFor(false, kind)
		if err != nil {
			t.Fatal(err)
		}
		p.Done(Busy)
	}
	for range 12 {
		attempt(th, false, Busy)
		attempt(th, false, Accept)
	}
	clk.Advance(30 * time.Millisecond)
	th.RetryAllowedFor("A") // forgets the window, and the kinds'
	for range 10 {
		clk.Advance(5 * time.Millisecond)
		attempt(th, true, Overload)
		attempt(th, false, Overload)
		attempt(th, false, Silence)
	}
	if !th.Down() {
		t.Fatal("setup: not down after 100 ms of failures")
	}
	th.Revive()
	th.Connectivity(false)
	th.Connectivity(true)
	_, _ = th.ProbeIn(), th.ProbabilityFor("A")
	if clk.under != 0 {
		t.Fatalf("the clock was read %d times with the throttle's lock held", clk.under)
	}
}
