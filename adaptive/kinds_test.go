package adaptive

import (
	"fmt"
	"testing"
	"time"
)

// A kind that fails everything beside one that is served: the served
// kind is never shed and the target never goes down, while the failing
// kind is shed on its own evidence; a kind not seen yet goes out. With one
// probability for all, the served kind was shed with the failing one (a
// user's trial: 16-39 % of a server's healthy unary calls while its watch
// failed, retries off 100 %).
func TestKindFailingAloneShedsOnlyItself(t *testing.T) {
	th, clk := newTest(t, Config{Rand: nil})
	draws := 0
	th.rand = func() float64 { draws++; return float64(draws%100) / 100 } // spread over [0, 1)
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
		if i == 150 {
			if th.RetryAllowedFor("/svc/Get") != true || th.HealthyFor("/svc/Get") != true {
				t.Errorf("a get's retry refused, or the get not healthy, while only the watch fails")
			}
			if th.RetryAllowedFor("/svc/Watch") {
				t.Errorf("a retry of the watch allowed while it fails everything")
			}
		}
		clk.Advance(10 * time.Millisecond)
	}
	st := th.Stats()
	if st.Downs != 0 {
		t.Errorf("%d downs, want none: the target serves its gets", st.Downs)
	}
	if sentWatch*10 > watches {
		t.Errorf("%d of %d watch opens sent, want them shed on their own evidence (under a tenth)", sentWatch, watches)
	}
	// A kind not seen yet goes out, to learn what it gets.
	if _, err := th.AllowFor(false, "/svc/New"); err != nil {
		t.Errorf("a new kind: %v, want allowed", err)
	}
}

// A kind's probability is never above the target's while the kind gets
// accepts; a kind that failed everything is shed on its own evidence;
// and past maxKinds kinds in the window, another kind is shed as the
// target is.
func TestKindProbabilityBounded(t *testing.T) {
	th, clk := newTest(t, Config{})
	for i := range 100 { // the kinds fail: the target sheds
		for k := range maxKinds {
			if p, err := th.AllowFor(false, fmt.Sprintf("k%d", k)); err == nil {
				if k%2 == 0 && i%4 == 0 {
					p.Done(Accept) // the even kinds: one in four accepted
				} else {
					p.Done(Overload)
				}
			}
		}
		clk.Advance(time.Millisecond)
	}
	el := th.elapsed()
	th.mu.Lock()
	defer th.mu.Unlock()
	pt := th.probability(el)
	if pt == 0 {
		t.Fatal("setup: the target does not shed")
	}
	for k := range maxKinds {
		pk := th.kindProbability(el, fmt.Sprintf("k%d", k), pt)
		switch {
		case k%2 == 0 && (pk > pt || pk == 0):
			t.Errorf("kind k%d, accepted at times: %v with the target at %v, want (0, target]", k, pk, pt)
		case k%2 == 1 && pk <= pt:
			t.Errorf("kind k%d, failing everything: %v with the target at %v, want more", k, pk, pt)
		}
	}
	if pk := th.kindProbability(el, "one more", pt); pk != pt {
		t.Errorf("a kind past %d: %v, want the target's %v", maxKinds, pk, pt)
	}
}

// A kind answered busy (admission control refusing it) is not a kind
// that fails everything: it is shed no harder than the target.
func TestKindBusyIsNotFailing(t *testing.T) {
	th, clk := newTest(t, Config{})
	for range 100 {
		for range 5 {
			if p, err := th.AllowFor(false, "busy"); err == nil {
				p.Done(Busy)
			}
		}
		if p, err := th.AllowFor(false, "get"); err == nil {
			p.Done(Accept)
		}
		clk.Advance(time.Millisecond)
	}
	el := th.elapsed()
	th.mu.Lock()
	defer th.mu.Unlock()
	pt := th.probability(el)
	if pk := th.kindProbability(el, "busy", pt); pk > pt {
		t.Errorf("a kind answered busy: %v with the target at %v, want no more", pk, pt)
	}
	if th.kindFailsAll(el) {
		t.Error("a kind answered busy counted as failing everything")
	}
}
