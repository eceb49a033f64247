package admission

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

// timerClock is a fake clock with timers (Timers): Advance fires the
// timers that are due, in the goroutine that calls it, in the order of
// their times.
type timerClock struct {
	*clock.Fake
	mu     sync.Mutex
	timers timerHeap
	seq    int
}

type fakeTimer struct {
	at   time.Time
	seq  int
	f    func()
	done bool
}

// timerHeap orders the pending timers by time, then by creation.
type timerHeap []*fakeTimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(*fakeTimer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return t
}

func newTimerClock() *timerClock {
	return &timerClock{Fake: clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
}

func (c *timerClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{at: c.Now().Add(d), seq: c.seq, f: f}
	heap.Push(&c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		stopped := !t.done
		t.done = true
		return stopped
	}
}

// nextDue returns how long until the next pending timer is due (0 if
// due now), and false if none is pending.
func (c *timerClock) nextDue() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.timers) > 0 && c.timers[0].done {
		heap.Pop(&c.timers)
	}
	if len(c.timers) == 0 {
		return 0, false
	}
	return max(c.timers[0].at.Sub(c.Now()), 0), true
}

func (c *timerClock) Advance(d time.Duration) {
	c.Fake.Advance(d)
	now := c.Now()
	var due []*fakeTimer
	c.mu.Lock()
	for len(c.timers) > 0 && !c.timers[0].at.After(now) {
		t := heap.Pop(&c.timers).(*fakeTimer)
		if !t.done {
			t.done = true
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
}

// result is what a waiter's Wait returned.
type result struct {
	name string
	p    Permit
	err  error
}

// queueTest is a Limiter with a fixed limit and a queue, and helpers to
// start waiters one at a time.
type queueTest struct {
	t       *testing.T
	l       *Limiter
	clk     *timerClock
	entered chan struct{}
	results chan result
}

func newQueueTest(t *testing.T, cfg Config) *queueTest {
	t.Helper()
	qt := &queueTest{t: t, clk: newTimerClock(), entered: make(chan struct{}, 16), results: make(chan result, 16)}
	cfg.Clock = qt.clk
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.q.onQueue = func() { qt.entered <- struct{}{} }
	qt.l = l
	return qt
}

// wait starts a Wait named name and returns once it is in the queue.
func (qt *queueTest) wait(ctx context.Context, name string, c Class, deadline time.Time) {
	qt.t.Helper()
	returned := make(chan error, 1)
	go func() {
		p, err := qt.l.Wait(ctx, c, deadline)
		returned <- err
		qt.results <- result{name, p, err}
	}()
	select {
	case <-qt.entered:
	case err := <-returned:
		qt.t.Fatalf("%s: Wait returned %v at once, want it to wait", name, err)
	}
}

// next returns the next waiter to return.
func (qt *queueTest) next() result {
	qt.t.Helper()
	select {
	case r := <-qt.results:
		return r
	case <-time.After(10 * time.Second): // a hang, not a measurement
		qt.t.Fatal("no waiter returned")
		return result{}
	}
}

// hold takes n slots with Acquire.
func (qt *queueTest) hold(n int) []Permit {
	qt.t.Helper()
	var ps []Permit
	for range n {
		p, err := qt.l.Acquire(ClassFirst, time.Time{})
		if err != nil {
			qt.t.Fatalf("hold: %v", err)
		}
		ps = append(ps, p)
	}
	return ps
}

func fixed(limit, queue int) Config {
	return Config{MaxInFlight: limit, QueueSize: queue,
		QueueTimeout: 100 * time.Millisecond, QueueTarget: 50 * time.Millisecond}
}

func TestQueueFIFO(t *testing.T) {
	qt := newQueueTest(t, fixed(1, 4))
	held := qt.hold(1)
	for _, name := range []string{"a", "b", "c"} {
		qt.wait(context.Background(), name, ClassFirst, time.Time{})
		qt.clk.Advance(10 * time.Millisecond)
	}
	if got := qt.l.Stats().Queue; got != 3 {
		t.Fatalf("Queue = %d, want 3", got)
	}
	p := held[0]
	for _, want := range []string{"a", "b", "c"} {
		p.Release(Measured)
		r := qt.next()
		if r.name != want || r.err != nil {
			t.Fatalf("got %s (%v), want %s admitted", r.name, r.err, want)
		}
		p = r.p
	}
	p.Release(Measured)
	if got := qt.l.InFlight(); got != 0 {
		t.Errorf("InFlight = %d, want 0", got)
	}
}

func TestQueueLIFOWhenBackedUp(t *testing.T) {
	qt := newQueueTest(t, fixed(1, 8))
	held := qt.hold(1)
	bg := context.Background()
	qt.wait(bg, "a", ClassFirst, time.Time{}) // at 0: times out at 100 ms
	qt.clk.Advance(30 * time.Millisecond)
	qt.wait(bg, "b", ClassFirst, time.Time{}) // at 30
	qt.clk.Advance(30 * time.Millisecond)
	qt.wait(bg, "c", ClassFirst, time.Time{}) // at 60
	qt.clk.Advance(45 * time.Millisecond)     // 105: the queue has been busy for 100 ms
	if r := qt.next(); r.name != "a" || !errors.Is(r.err, ErrQueueTimeout) {
		t.Fatalf("got %s (%v), want a timed out", r.name, r.err)
	}
	// Backed up: when d arrives, b has waited 75 ms, over QueueTarget,
	// and is dropped.
	qt.wait(bg, "d", ClassFirst, time.Time{}) // at 105
	if r := qt.next(); r.name != "b" || !errors.Is(r.err, ErrQueueTimeout) {
		t.Fatalf("got %s (%v), want b dropped after QueueTarget", r.name, r.err)
	}
	// Then the newest first: d, then c.
	held[0].Release(Measured)
	r := qt.next()
	if r.name != "d" || r.err != nil {
		t.Fatalf("got %s (%v), want d (the newest) admitted", r.name, r.err)
	}
	r.p.Release(Measured)
	r = qt.next()
	if r.name != "c" || r.err != nil {
		t.Fatalf("got %s (%v), want c admitted", r.name, r.err)
	}
	r.p.Release(Measured)
	st := qt.l.Stats()
	if st.RejectedQueue != 2 || st.Queue != 0 || st.InFlight != 0 {
		t.Errorf("Stats = %+v, want RejectedQueue 2, Queue 0, InFlight 0", st)
	}
}

func TestQueueTimeout(t *testing.T) {
	qt := newQueueTest(t, fixed(1, 4))
	held := qt.hold(1)
	defer held[0].Release(Ignored)
	qt.wait(context.Background(), "a", ClassFirst, time.Time{})
	qt.clk.Advance(99 * time.Millisecond)
	select {
	case r := <-qt.results:
		t.Fatalf("%s returned %v before QueueTimeout", r.name, r.err)
	default:
	}
	qt.clk.Advance(time.Millisecond)
	if r := qt.next(); !errors.Is(r.err, ErrQueueTimeout) {
		t.Fatalf("got %v, want ErrQueueTimeout", r.err)
	}
	// The deadline bounds the wait too.
	qt.wait(context.Background(), "b", ClassFirst, qt.clk.Now().Add(20*time.Millisecond))
	qt.clk.Advance(20 * time.Millisecond)
	if r := qt.next(); !errors.Is(r.err, ErrQueueTimeout) {
		t.Fatalf("got %v, want ErrQueueTimeout at the deadline", r.err)
	}
	if st := qt.l.Stats(); st.RejectedQueue != 2 || st.Queue != 0 {
		t.Errorf("Stats = %+v, want RejectedQueue 2, Queue 0", st)
	}
}

func TestQueueCancel(t *testing.T) {
	qt := newQueueTest(t, fixed(1, 4))
	held := qt.hold(1)
	ctx, cancel := context.WithCancel(context.Background())
	qt.wait(ctx, "a", ClassFirst, time.Time{})
	cancel()
	if r := qt.next(); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", r.err)
	}
	if got := qt.l.Queue(); got != 0 {
		t.Fatalf("Queue = %d after cancel, want 0", got)
	}
	held[0].Release(Measured)
	if got := qt.l.InFlight(); got != 0 {
		t.Fatalf("InFlight = %d, want 0", got)
	}
	p, err := qt.l.Acquire(ClassFirst, time.Time{})
	if err != nil {
		t.Fatalf("Acquire after the waiter left: %v", err)
	}
	p.Release(Measured)
}

// A waiter given a slot as its caller leaves frees the slot.
func TestQueueCancelAfterGrant(t *testing.T) {
	qt := newQueueTest(t, fixed(1, 4))
	held := qt.hold(1)
	w := &waiter{class: ClassFirst, queued: true, ready: make(chan struct{})}
	qt.l.q.mu.Lock()
	qt.l.waitingN.Add(1)
	qt.l.q.lists[ClassFirst].push(w)
	qt.l.q.n++
	qt.l.q.mu.Unlock()
	held[0].Release(Measured) // dispatches the slot to w
	<-w.ready
	if got := qt.l.InFlight(); got != 1 {
		t.Fatalf("InFlight = %d after the grant, want 1", got)
	}
	if _, err := qt.l.leave(w, context.Canceled); !errors.Is(err, context.Canceled) {
		t.Fatalf("leave = %v, want context.Canceled", err)
	}
	if got := qt.l.InFlight(); got != 0 {
		t.Fatalf("InFlight = %d after leave, want 0", got)
	}
}

func TestQueueClassOrder(t *testing.T) {
	cfg := fixed(2, 4)
	cfg.RetryShare = 0.5 // a retry may use 1 slot of 2
	qt := newQueueTest(t, cfg)
	held := qt.hold(2)
	bg := context.Background()
	qt.wait(bg, "retry", ClassRetry, time.Time{})
	qt.clk.Advance(time.Millisecond)
	qt.wait(bg, "first", ClassFirst, time.Time{})
	// A newcomer retry does not take a slot ahead of the waiting first
	// attempt, even with Acquire.
	if _, err := qt.l.Acquire(ClassRetry, time.Time{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("Acquire(ClassRetry) = %v, want ErrLimit", err)
	}

	held[0].Release(Measured)
	r := qt.next()
	if r.name != "first" || r.err != nil {
		t.Fatalf("got %s (%v), want first admitted before the older retry", r.name, r.err)
	}
	first := r.p
	held[1].Release(Measured) // 1 in flight: the retry share is full
	select {
	case r := <-qt.results:
		t.Fatalf("%s returned (%v) over the retry share", r.name, r.err)
	default:
	}
	first.Release(Measured)
	r = qt.next()
	if r.name != "retry" || r.err != nil {
		t.Fatalf("got %s (%v), want retry admitted", r.name, r.err)
	}
	r.p.Release(Measured)
}

func TestQueueFull(t *testing.T) {
	qt := newQueueTest(t, fixed(1, 1))
	held := qt.hold(1)
	defer held[0].Release(Ignored)
	bg := context.Background()
	qt.wait(bg, "retry", ClassRetry, time.Time{})
	// A more valuable request takes the retry's place.
	qt.wait(bg, "first", ClassFirst, time.Time{})
	if r := qt.next(); r.name != "retry" || !errors.Is(r.err, ErrLimit) {
		t.Fatalf("got %s (%v), want retry evicted with ErrLimit", r.name, r.err)
	}
	// One of the same class does not, while the queue drains.
	if _, err := qt.l.Wait(bg, ClassFirst, time.Time{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("Wait on a full queue = %v, want ErrLimit", err)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := qt.l.Wait(ctx, ClassRetry, time.Time{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("Wait(ClassRetry) on a full queue = %v, want ErrLimit", err)
	}
	qt.clk.Advance(100 * time.Millisecond)
	if r := qt.next(); r.name != "first" || !errors.Is(r.err, ErrQueueTimeout) {
		t.Fatalf("got %s (%v), want first timed out", r.name, r.err)
	}
}

func TestNoQueueByDefault(t *testing.T) {
	qt := newQueueTest(t, Config{MaxInFlight: 1})
	held := qt.hold(1)
	defer held[0].Release(Ignored)
	if _, err := qt.l.Wait(context.Background(), ClassFirst, time.Time{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("Wait without a queue = %v, want ErrLimit at once", err)
	}
}

func TestQueueConfig(t *testing.T) {
	for _, cfg := range []Config{
		{QueueSize: -1},
		{QueueSize: 1}, // a queue needs MaxInFlight
		{QueueTimeout: -time.Second},
		{QueueTarget: -time.Second},
		{QueueTimeout: time.Millisecond, QueueTarget: 2 * time.Millisecond},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	l, err := New(Config{MaxInFlight: 1, QueueSize: 4, QueueTimeout: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Config().QueueTarget; got != 2*time.Millisecond {
		t.Errorf("QueueTarget = %v, want QueueTimeout (2ms) when shorter than the default", got)
	}
}

// Parallel waiters on the system clock: every one ends admitted or
// timed out, and nothing is left in flight or in the queue.
func TestQueueStress(t *testing.T) {
	l, err := New(Config{MaxInFlight: 2, QueueSize: 4, QueueTimeout: time.Millisecond, QueueTarget: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				ctx, cancel := context.WithCancel(context.Background())
				if i%7 == g%7 {
					cancel()
				}
				p, err := l.Wait(ctx, Class(i%int(numClasses)), time.Time{})
				cancel()
				if err == nil {
					p.Release(Measured)
				} else if !errors.Is(err, ErrLimit) && !errors.Is(err, ErrQueueTimeout) && !errors.Is(err, context.Canceled) {
					t.Errorf("Wait = %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if st := l.Stats(); st.InFlight != 0 || st.Queue != 0 {
		t.Errorf("Stats = %+v, want nothing in flight or queued", st)
	}
}
