package admission

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrQueueTimeout: the request waited in the queue (Config.QueueSize) for
// the longest wait without getting a slot. Check it with errors.Is.
var ErrQueueTimeout = errors.New("admission: timed out in the queue")

// Timers is implemented by a Clock that also runs timers; the queue's
// timeouts use it, so that a fake clock can fire them. AfterFunc calls f
// in its own goroutine (or, for a fake clock, in the one that moves the
// clock) once d has passed, unless stop was called first; stop reports
// whether it stopped the timer.
type Timers interface {
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// Wait is Acquire with a queue: when Config.MaxInFlight is reached for
// class c and Config.QueueSize is not zero, the request waits for a slot, and Wait
// returns when it gets one, when it has waited the longest wait
// (ErrQueueTimeout), when the queue is full and a more valuable request
// takes its place (ErrLimit), or when ctx ends (ctx.Err(), and the
// request leaves the queue at once). Without a queue Wait is Acquire.
//
// The queue follows CoDel, the way Facebook's servers use it ("adaptive
// LIFO"): while it drains, waiters are served first come, first served,
// and wait at most Config.QueueTimeout; once it has not been empty for
// QueueTimeout it is backed up, and the newest waiters are served first
// (the oldest are the most likely to have been given up by their
// callers), and no one waits longer than Config.QueueTarget. A waiter
// never waits past its deadline less the server's latency without a
// queue (Stats.Base). Class order holds in the queue: a waiter is served only when no
// more valuable request waits, and when the queue is full, a newcomer
// takes the place of the oldest waiter of a less valuable class (or, when
// backed up, of its own class).
//
// The latency a Permit reports starts when the request gets its slot:
// the time in the queue is not the server's latency.
//
// Wait also applies the overload rule, as Acquire does, and while a
// probe runs it holds a request it refuses until the probe ends or ctx
// does (see Limiter).
func (l *Limiter) Wait(ctx context.Context, c Class, deadline time.Time) (Permit, error) {
	return l.acquire(ctx, true, false, c, deadline)
}

// WaitHeld is Wait for a request that a tier above held back already
// (Permit.Held: its caller admitted it in its own suspect phase, whose
// cap bounds what that tier sends below, because its work became slower
// rather than queued). A suspect server admits it at once, beyond its
// own cap, while fewer than 8 times the cap are in flight, and holds it
// as Wait does beyond that; the overload rule, Config.MaxInFlight and
// the queue apply as in Wait, and the request counts as any other, but
// for the cap: those admitted while the server is suspect leave it to
// the server's own requests (Wait), which wait only while as many of
// their own are in flight as the cap (not those that waited in the
// queue of Config.QueueSize: they count as its own).
//
// Held again at every tier, a request waits once per tier, and each
// tier's cap grows only on what the tier above lets through. A server
// of fast requests given slow ones as well (busy's mix over TCP: a
// report, a batch), behind two tiers that wait on it, made all three
// suspect at once: the middle tier's arrivals came in bursts of what the
// gateway let through (0-4 a window, then 44), so that its cap's need
// read a fraction of what waited, and it held the gateway's requests for
// over a second; the gateway's suspect phase ran out into an overload
// that refused about 70 % of a healthy load. Held once, none.
//
// The bound: the tier above bounds what it sends, but a mark that was
// forged, or that reached a dependency off the slow path (a request's
// calls all carry it), is bounded by nothing else. Every request marked
// and no bound, a pool of 16 workers at 8 times its capacity held 9 649
// in flight where it held 122, and learnt a base of 514 ms where it
// learnt 10 ms (a review's simulation). The mix that the mark serves
// needs about 40 in flight at the order tier, whose cap starts at 6.
func (l *Limiter) WaitHeld(ctx context.Context, c Class, deadline time.Time) (Permit, error) {
	return l.acquire(ctx, true, true, c, deadline)
}

// Queue returns the number of requests waiting in the queue.
func (l *Limiter) Queue() int {
	l.q.mu.Lock()
	defer l.q.mu.Unlock()
	return l.q.n
}

// resolveQueue checks and fills in the queue's fields.
func (c *Config) resolveQueue() error {
	switch {
	case c.QueueSize < 0:
		return invalidf("QueueSize %d is negative", c.QueueSize)
	case c.QueueTimeout < 0:
		return invalidf("QueueTimeout %v is negative", c.QueueTimeout)
	case c.QueueTarget < 0:
		return invalidf("QueueTarget %v is negative", c.QueueTarget)
	}
	orDefault(&c.QueueTimeout, DefaultQueueTimeout)
	if c.QueueTarget == 0 {
		c.QueueTarget = min(DefaultQueueTarget, c.QueueTimeout)
	}
	if c.QueueTarget > c.QueueTimeout {
		return invalidf("QueueTarget %v above QueueTimeout %v", c.QueueTarget, c.QueueTimeout)
	}
	return nil
}

// waiter is a request in the queue. Its fields are guarded by queue.mu;
// p and err are set before ready is closed.
type waiter struct {
	class      Class
	at         int64 // when it entered, nanoseconds since origin
	prev, next *waiter
	queued     bool
	ready      chan struct{}
	p          Permit
	err        error
}

// waitList is the waiters of one class, oldest first.
type waitList struct{ head, tail *waiter }

func (q *waitList) push(w *waiter) {
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
}

func (q *waitList) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
}

// queue is the Limiter's wait queue.
type queue struct {
	mu      sync.Mutex
	lists   [numClasses]waitList
	n       int
	busyAt  int64  // when the queue last became non-empty
	onQueue func() // tests: called when a waiter entered the queue
}

// backedUp reports whether the queue has not been empty for QueueTimeout.
// Called with q.mu held.
func (l *Limiter) backedUp(at int64) bool {
	return l.q.n > 0 && at-l.q.busyAt >= int64(l.cfg.QueueTimeout)
}

// remove takes w out of the queue and wakes it with p or err. Called with
// q.mu held.
func (l *Limiter) remove(w *waiter, p Permit, err error) {
	l.q.lists[w.class].remove(w)
	w.queued = false
	l.q.n--
	l.waitingN.Add(-1)
	w.p, w.err = p, err
	close(w.ready)
}

// expireStale drops, once the queue is backed up, the waiters that have
// waited longer than QueueTarget. Called with q.mu held.
func (l *Limiter) expireStale(at int64) {
	if !l.backedUp(at) {
		return
	}
	for c := range l.q.lists {
		for w := l.q.lists[c].head; w != nil && at-w.at > int64(l.cfg.QueueTarget); w = l.q.lists[c].head {
			l.rejected[reasonQueue].Add(1)
			l.remove(w, Permit{}, ErrQueueTimeout)
		}
	}
}

// next returns the waiter to serve next: of the most valuable class
// waiting, the oldest, or the newest when backed up; nil when none waits.
// Called with q.mu held.
func (l *Limiter) next(backedUp bool) *waiter {
	for k := range l.q.lists {
		if list := &l.q.lists[k]; list.head != nil {
			if backedUp {
				return list.tail
			}
			return list.head
		}
	}
	return nil
}

// goesFirst reports whether a request of class c arriving now goes
// before every waiter: when none waits of its class or a more valuable
// one, or, when backed up (LIFO), none of a more valuable one. Called
// with q.mu held.
func (l *Limiter) goesFirst(c Class, backedUp bool) bool {
	for k := Class(0); k <= c && k < numClasses; k++ {
		if l.q.lists[k].head != nil {
			return k == c && backedUp
		}
	}
	return true
}

// dispatch gives free slots to waiters, in order, as long as their class
// limit allows.
func (l *Limiter) dispatch() {
	at := l.now()
	l.q.mu.Lock()
	defer l.q.mu.Unlock()
	l.expireStale(at)
	for l.q.n > 0 {
		w := l.next(l.backedUp(at))
		p, ok := l.take(w.class, at)
		if !ok {
			return
		}
		l.remove(w, p, nil)
	}
}

// enqueue is acquire's slow path, with a queue: take a free slot when no
// waiter goes first, else (queue true) wait in the queue.
func (l *Limiter) enqueue(ctx context.Context, queue bool, c Class, deadline time.Time, at int64, now time.Time) (Permit, error) {
	q := &l.q
	q.mu.Lock()
	// Count the request before it looks at the slots: a Release that
	// frees one after this sees it and dispatches.
	l.waitingN.Add(1)
	l.expireStale(at)
	backedUp := l.backedUp(at)
	if l.goesFirst(c, backedUp) {
		if p, ok := l.take(c, at); ok {
			l.waitingN.Add(-1)
			q.mu.Unlock()
			return p, nil
		}
	}
	wait := l.cfg.QueueTimeout
	if backedUp {
		wait = l.cfg.QueueTarget
	}
	if !deadline.IsZero() {
		wait = min(wait, deadline.Sub(now)-l.baseLatency())
	}
	if !queue || wait <= 0 || q.n >= l.cfg.QueueSize && !l.evict(c, backedUp) {
		l.waitingN.Add(-1)
		q.mu.Unlock()
		l.rejected[reasonLimit].Add(1)
		return Permit{}, ErrLimit
	}
	w := &waiter{class: c, at: at, queued: true, ready: make(chan struct{})}
	if q.n == 0 {
		q.busyAt = at
	}
	q.lists[c].push(w)
	q.n++
	hook := q.onQueue
	q.mu.Unlock()
	stop := l.afterFunc(wait, func() { l.expire(w) })
	if hook != nil {
		hook() // after the timer started: a test may move the clock now
	}
	select {
	case <-w.ready:
		stop()
		return w.p, w.err
	case <-ctx.Done():
		stop()
		return l.leave(w, ctx.Err())
	}
}

// evict makes room in a full queue for a request of class c: it drops
// the oldest waiter of the least valuable class, if that class is less
// valuable than c, or, when backed up, the same. Called with q.mu held.
func (l *Limiter) evict(c Class, backedUp bool) bool {
	for k := numClasses - 1; k >= c; k-- {
		w := l.q.lists[k].head
		if w == nil {
			continue
		}
		if k == c && !backedUp {
			return false
		}
		l.rejected[reasonLimit].Add(1)
		l.remove(w, Permit{}, ErrLimit)
		return true
	}
	return false
}

// expire ends w's wait with ErrQueueTimeout, if it still waits.
func (l *Limiter) expire(w *waiter) {
	l.q.mu.Lock()
	defer l.q.mu.Unlock()
	if w.queued {
		l.rejected[reasonQueue].Add(1)
		l.remove(w, Permit{}, ErrQueueTimeout)
	}
}

// leave takes w out of the queue when its caller is gone, and frees the
// slot it may have been given meanwhile.
func (l *Limiter) leave(w *waiter, err error) (Permit, error) {
	l.q.mu.Lock()
	if w.queued {
		l.remove(w, Permit{}, err)
		l.q.mu.Unlock()
		return Permit{}, err
	}
	p, werr := w.p, w.err
	l.q.mu.Unlock()
	if werr != nil {
		return Permit{}, werr
	}
	p.Release(Ignored)
	return Permit{}, err
}

// afterFunc runs f after d on the Limiter's clock.
func (l *Limiter) afterFunc(d time.Duration, f func()) func() bool {
	if t, ok := l.clk.(Timers); ok {
		return t.AfterFunc(d, f)
	}
	return time.AfterFunc(d, f).Stop
}
