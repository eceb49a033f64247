package adaptive

import (
	"testing"
	"time"
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
