package admission

import (
	"testing"
	"time"
)

// A tier starved of CPU keeps its overload (busy's CPU-bound overload,
// where every tier of the chain shares two busy cores). Traced there: a
// starved gateway, overloaded, saw whole windows in which nothing
// arrived (it read its callers' connection late) while thousands of its
// requests were in flight, and completions that were all Abandoned. Two
// such windows read as calm and ended the overload, and the tier
// admitted everything until its callers' deadlines ended it: a quarter
// of the runs collapsed to 0.11-0.28x of capacity. A window in which
// nothing arrived, not even to be refused, while requests are in flight
// tells nothing of the load: it neither ends an overload nor counts
// against its end.
func TestStarvedWindowsKeepTheOverload(t *testing.T) {
	const workers, service = 2, 500 * time.Microsecond
	capacity := workers / service.Seconds()
	s := newSim(t, Config{}, workers, service, 1)
	s.late, s.leave = true, true
	s.wait = 100 * time.Millisecond // a gateway's wait on the tiers below
	s.open(0.5*capacity, 0, time.Second, time.Second)
	s.open(2*capacity, time.Second, 3*time.Second, time.Second)
	s.run(2 * time.Second)
	l := s.l
	if !l.Overloaded() {
		t.Fatal("not overloaded at twice its capacity: the test shows nothing")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	inflight := l.inflight.Load()
	for i := range 3 * calmWindows {
		// What the trace showed: nothing arrived, 85 completed, all of
		// them too late for their callers.
		starved := window{dur: int64(l.cfg.Window), done: 85, abandoned: 85, wasted: 85, inflight: inflight, over: true}
		l.record(starved)
		l.whileOverloaded(starved, l.now())
		if !l.overloaded.Load() {
			t.Fatalf("overload ended after %d windows in which nothing arrived, with %d in flight", i+1, inflight)
		}
	}
}

// The base is the latency of the server without a queue: the successes
// of windows whose arrivals exceeded their completions (a queue
// building) are no sample of it while calm windows give one. Traced in
// busy's CPU-bound overload: once a starved tier's overload had ended,
// its base followed the queue it was building (1.6 -> 25 -> 106 -> 347
// -> 909 ms over three seconds, 7 768 in flight), so that what it held
// never again looked like a queue, and it was never suspect again.
func TestBaseIgnoresAGrowingQueue(t *testing.T) {
	l := calmLimiter(t)
	before, _ := l.pooledMean()
	for range 64 {
		// A queue building: twice as many arrived as completed, and the
		// successes took half a second.
		l.record(window{dur: int64(l.cfg.Window), arrived: 200, done: 100, latSum: 100 * (500 * time.Millisecond).Nanoseconds(), latN: 100, least: (400 * time.Millisecond).Nanoseconds(), inflight: 5000})
	}
	if after, _ := l.pooledMean(); after > 2*before {
		t.Errorf("base %v after a queue built for 64 windows, %v before: it followed the queue", time.Duration(after), time.Duration(before))
	}
}

// Right after an overload the history holds the overload's windows and
// the busy ones after it, no calm one: the base stays what it was
// rather than the latency of the queue the overload left. Traced in
// busy's CPU-bound overload: a gateway's base went from 1.3 to 26 ms in
// the first window after its overload ended.
func TestBaseKeptAfterAnOverload(t *testing.T) {
	l := calmLimiter(t)
	before := l.base
	win := int64(l.cfg.Window)
	for range historyWindows {
		l.record(window{dur: win, arrived: 40, refused: 50, done: 50, latSum: 50 * (20 * time.Millisecond).Nanoseconds(), latN: 50, inflight: 100, over: true})
	}
	// A base the model check found earlier, still the least base, and
	// below the base now: it stays the least, not the base.
	l.floor, l.floorFor = before/2, historyWindows
	// The overload ended; what it left is served, and more arrives.
	after := window{dur: win, arrived: 90, done: 74, latSum: 74 * (26 * time.Millisecond).Nanoseconds(), latN: 74, inflight: 120}
	l.record(after)
	l.whileNot(after)
	if l.base != before {
		t.Errorf("base %v right after an overload, %v before it: it took the latency of the queue the overload left", time.Duration(l.base), time.Duration(before))
	}
}

// calmLimiter returns the Limiter of a server on 8 workers of 1 ms after
// a second of a calm closed loop of 4 callers, with its base, and with
// its lock held until the test ends.
func calmLimiter(t *testing.T) *Limiter {
	t.Helper()
	s := newSim(t, Config{}, 8, time.Millisecond, 1)
	s.closed(4, 0, time.Second)
	s.run(time.Second)
	l := s.l
	l.mu.Lock()
	t.Cleanup(l.mu.Unlock)
	if l.base <= 0 || l.base > 2*time.Millisecond.Nanoseconds() {
		t.Fatalf("base %v after a second of a calm closed loop on 1 ms workers: the test shows nothing", time.Duration(l.base))
	}
	return l
}
