package admission

import (
	"container/heap"
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// sim is a discrete-event model of a server behind a Limiter, on a fake
// clock with timers: a pool of workers that serves admitted requests in
// order, each for a service time, loaded by a closed loop of callers
// (each sends its next request when the last one is answered, refused or
// not) or by open-loop arrivals (independent of the answers). Refused
// requests that the Limiter holds during a probe are answered when the
// probe ends, as Wait would.
type sim struct {
	t       *testing.T
	l       *Limiter
	clk     *timerClock
	rnd     *rand.Rand
	workers int
	service func(r *rand.Rand) time.Duration
	el      time.Duration // elapsed since the start

	events  eventHeap
	queue   []*simReq // admitted, waiting for a worker
	busy    int
	held    []heldReq
	parked  []parkedReq
	seq     int
	results []simResult
	// seenFromQueue is the Limiter's fromQueue when release last looked
	// through the parked requests.
	seenFromQueue int64
	// onAnswer is called when a closed-loop caller's request is answered.
	onAnswer func(caller int)
	// fail, when set, says whether a request admitted now fails, and its
	// service time then (released as Failed).
	fail func() (bool, time.Duration)
	// failAs, when set, gives the outcome of each failing request by
	// the time it took to fail (Abandoned: its caller's deadline ended
	// it); nil means Failed.
	failAs func(took time.Duration) Outcome
	// late: a request served after its caller's deadline is released
	// Abandoned, as the interceptor does (its caller had left).
	late bool
	// refusedRTT, when set, is how long a closed-loop caller takes to
	// send again after a refusal (else the round trip, 100 µs): a chain
	// whose CPU is saturated answers refusals slowly, and its callers'
	// spin reads a few times their rate of before, not tens.
	refusedRTT time.Duration
	// lastRefused: the closed-loop callers whose request was refused
	// and is not yet answered, with refusedRTT set.
	lastRefused map[int]bool
	// classOf, when set, gives the class of each new request.
	classOf func() Class
	// onAdmit, when set, is called with the permit of every request
	// admitted, and whether it waited first.
	onAdmit func(p Permit, waited bool)
	// wait, when set, is how long an admitted request waits before it
	// needs a worker (a sleep or a call below that its deadline ends,
	// as the bench's payment waits), holding no worker.
	wait time.Duration
	// leave: a closed-loop caller leaves at its deadline and sends its
	// next request then, as ghz does; its request, if still in its wait,
	// ends then (released Abandoned), and otherwise runs on to its end
	// (released Abandoned, as late is). Without leave, a caller waits for
	// the answer however late.
	leave bool
	// off: no limiter at all (retries off's server): every request goes
	// in.
	off bool
	// starve, when set, gives for a request sent at a time when the
	// server reads it, that time or later: a tier starved of CPU reads
	// its callers' connections late, and what they sent meanwhile at
	// once. Its caller's deadline runs from when it was sent.
	starve func(sent time.Duration) time.Duration
}

type simReq struct {
	arrived time.Duration
	permit  Permit
	caller  int // closed loop: the caller; -1 for open loop
	class   Class
	fail    bool
	dl      time.Time // its caller's deadline; zero: none
	// With sim.leave: waiting is true during the wait before a worker,
	// queued while it waits for a worker, left once its caller left.
	waiting, queued, left, done bool
	// held: served, its answer held by an answer probe (see heldReq).
	held bool
}

type heldReq struct {
	h      *chan struct{}
	caller int
	// answer: a served request's answer, held by an answer probe
	// (HoldAnswer), recorded when it goes out, unless its caller left
	// meanwhile (req.left: then its deadline's error); req is that
	// request.
	answer *simResult
	req    *simReq
}

// parkedReq is a request waiting in the limiter while the server is
// suspect, as Wait would wait.
type parkedReq struct {
	w        *suspectWaiter
	caller   int
	class    Class
	arrived  time.Duration
	deadline time.Time
}

// simResult is one answered request.
type simResult struct {
	at       time.Duration // when it arrived
	latency  time.Duration
	refused  bool
	deadline bool // refused for its deadline
	gone     bool // its deadline passed while it waited in the limiter
	timedOut bool // admitted, and its caller left at its deadline (sim.leave)
	class    Class
}

type event struct {
	at  time.Duration
	seq int
	f   func()
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func newSim(t *testing.T, cfg Config, workers int, service time.Duration, seed uint64) *sim {
	t.Helper()
	clk := newTimerClock()
	cfg.Clock = clk
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t, l: l, clk: clk, rnd: rand.New(rand.NewPCG(seed, 1)), workers: workers}
	s.service = func(*rand.Rand) time.Duration { return service }
	return s
}

func (s *sim) at(d time.Duration, f func()) {
	s.seq++
	heap.Push(&s.events, event{at: d, seq: s.seq, f: f})
}

// run processes events until the elapsed time reaches end, and the
// Limiter's timers when they are due (a timer that a timer's function
// set fires at its time, not at the next event's).
func (s *sim) run(end time.Duration) {
	for {
		next := end
		if s.events.Len() > 0 {
			next = min(next, s.events[0].at)
		}
		if d, ok := s.clk.nextDue(); ok && s.el+d < next {
			s.clk.Advance(max(d, 1))
			s.el += max(d, 1)
			s.release()
			continue
		}
		if s.events.Len() == 0 || s.events[0].at > end {
			break
		}
		e := heap.Pop(&s.events).(event)
		if e.at > s.el {
			s.clk.Advance(e.at - s.el)
			s.el = e.at
			s.release()
		}
		e.f()
	}
	if end > s.el {
		s.clk.Advance(end - s.el)
		s.el = end
		s.release()
	}
}

// release answers the held refusals whose probe ended, and moves the
// parked requests whose wait ended.
func (s *sim) release() {
	// The waits that ended (admitted one at a time, released all at
	// once, or admitted before their deadline) go on, oldest first: a
	// release closes their channels oldest first, and their goroutines
	// run in about that order. A wait ends only with a release (the
	// newest is ready then) or an admission from the wait (fromQueue
	// grows): look through all only then.
	if n := len(s.parked); n > 0 && (s.l.fromQueue.Load() != s.seenFromQueue || isClosed(s.parked[n-1].w.ready)) {
		s.seenFromQueue = s.l.fromQueue.Load()
		// The requests still waiting keep their order, moved in place
		// towards the front (thousands wait at eight times a pool's
		// capacity: a copy of them all per admission made the race
		// detector's range checks most of the package's time); the
		// requests parked meanwhile (by decide) go after them.
		parked := s.parked
		s.parked = nil
		var ended []parkedReq
		keep := 0
		for _, r := range parked {
			if !isClosed(r.w.ready) {
				parked[keep] = r
				keep++
				continue
			}
			ended = append(ended, r)
		}
		for _, r := range ended {
			if p, err, settled := s.l.settle(r.w); settled && err != nil {
				s.results = append(s.results, simResult{at: r.arrived, refused: true, class: r.class})
				s.refusedBy(r.caller)
				s.answered(r.caller)
			} else if settled {
				s.admitted(p, r.caller, r.class, r.arrived, r.deadline)
			} else {
				s.decide(r.caller, r.class, r.deadline, r.arrived)
			}
		}
		s.parked = append(parked[:keep], s.parked...)
	}
	// Deadlines pass oldest first: at the front.
	for len(s.parked) > 0 {
		r := s.parked[0]
		if r.deadline.IsZero() || s.clk.Now().Before(r.deadline) {
			break
		}
		s.l.sq.mu.Lock()
		closed := r.w.closed
		if !closed {
			r.w.gone = true
			s.l.gone.Add(1)
		}
		s.l.sq.mu.Unlock()
		if closed {
			break // admitted meanwhile: the scan above takes it next time
		}
		s.parked = s.parked[1:]
		s.results = append(s.results, simResult{at: r.arrived, gone: true, class: r.class})
		s.answered(r.caller)
	}
	kept := s.held[:0]
	for _, h := range s.held {
		select {
		case <-*h.h:
			if h.req != nil && h.req.left {
				continue // its caller left at its deadline during the hold
			}
			if h.answer != nil {
				h.answer.latency = s.el - h.answer.at
				s.results = append(s.results, *h.answer)
			}
			if h.req != nil {
				h.req.held = false
			}
			s.answered(h.caller)
		default:
			kept = append(kept, h)
		}
	}
	s.held = kept
}

// arrive is a request arriving now.
func (s *sim) arrive(caller int, class Class, deadline time.Duration) {
	var dl time.Time
	if deadline > 0 {
		dl = s.clk.Now().Add(deadline)
	}
	if s.starve != nil {
		if read, sent := s.starve(s.el), s.el; read > sent {
			s.at(read, func() { s.decide(caller, class, dl, sent) })
			return
		}
	}
	s.decide(caller, class, dl, s.el)
}

// decide runs a request through the limiter as Wait does, without
// blocking: admitted, refused, or parked until its wait ends.
func (s *sim) decide(caller int, class Class, dl time.Time, arrived time.Duration) {
	if s.off {
		s.admitted(Permit{}, caller, class, arrived, dl)
		return
	}
	at := s.l.now()
	if at >= s.l.winEnd.Load() {
		s.l.roll(at)
	}
	p, w, _, err := s.l.gate(true, false, class, dl, at)
	switch {
	case w != nil:
		s.l.admitBefore(w, class, dl) // its timer, as await sets it
		s.parked = append(s.parked, parkedReq{w: w, caller: caller, class: class, arrived: arrived, deadline: dl})
		return
	case err == nil && p.l == nil:
		p, err = s.l.acquire(context.Background(), false, false, class, dl)
	}
	if err != nil {
		s.results = append(s.results, simResult{at: arrived, refused: true, deadline: err == ErrDeadline, class: class})
		s.refusedBy(caller)
		if h := s.l.probe.hold.Load(); h != nil && caller >= 0 {
			s.held = append(s.held, heldReq{h: h, caller: caller})
			return
		}
		s.answered(caller)
		return
	}
	s.admitted(p, caller, class, arrived, dl)
}

// admitted starts the service of a request admitted with p, whose caller
// waits until dl (zero: no deadline).
func (s *sim) admitted(p Permit, caller int, class Class, arrived time.Duration, dl time.Time) {
	if s.onAdmit != nil {
		s.onAdmit(p, arrived < s.el)
	}
	r := &simReq{arrived: arrived, permit: p, caller: caller, class: class, dl: dl}
	if s.leave && !dl.IsZero() {
		s.at(s.el+max(dl.Sub(s.clk.Now()), 0), func() {
			if r.done && !r.held {
				return // answered in time
			}
			if r.left = true; r.waiting || r.queued {
				// Its wait ends with the call, and a handler that has
				// not run yet does not (its context is done).
				r.permit.Release(Abandoned)
			}
			s.results = append(s.results, simResult{at: r.arrived, latency: s.el - r.arrived, timedOut: true, class: r.class})
			s.answered(r.caller)
		})
	}
	if s.wait == 0 {
		s.work(r)
		return
	}
	r.waiting = true
	s.at(s.el+s.wait, func() {
		if r.waiting = false; !r.left {
			s.work(r)
		}
	})
}

// work gives r a worker, or queues it for the next.
func (s *sim) work(r *simReq) {
	if s.busy < s.workers {
		s.start(r)
	} else {
		r.queued = true
		s.queue = append(s.queue, r)
	}
}

func (s *sim) start(r *simReq) {
	s.busy++
	d := s.service(s.rnd)
	if s.fail != nil {
		if f, fd := s.fail(); f {
			r.fail, d = true, fd
		}
	}
	s.at(s.el+d, func() {
		s.busy--
		r.done = true
		o := Measured
		switch {
		case r.fail && s.failAs != nil:
			o = s.failAs(d)
		case r.fail:
			o = Failed
		case r.left || s.late && !r.dl.IsZero() && !s.clk.Now().Before(r.dl):
			o = Abandoned
		}
		r.permit.Release(o)
		res := simResult{at: r.arrived, latency: s.el - r.arrived, class: r.class}
		// An answer an answer probe holds, as the interceptor holds it
		// (HoldAnswer: not for a caller that left).
		h := s.l.answerProbe.hold.Load()
		if o == Abandoned {
			h = nil
		}
		if !r.left && h == nil {
			s.results = append(s.results, res)
		}
		for len(s.queue) > 0 {
			next := s.queue[0]
			s.queue = s.queue[1:]
			if next.queued = false; !next.left {
				s.start(next)
				break
			}
		}
		switch {
		case r.left:
		case h != nil:
			r.held = true
			s.held = append(s.held, heldReq{h: h, caller: r.caller, answer: &res, req: r})
		default:
			s.answered(r.caller)
		}
	})
}

// exponential returns service times drawn from an exponential
// distribution of the given mean, for sim.service.
func exponential(mean time.Duration) func(*rand.Rand) time.Duration {
	return func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * float64(mean)) }
}

// abandoned is a sim.failAs: every failure ends at its caller's
// deadline.
func abandoned(time.Duration) Outcome { return Abandoned }

// noCaller marks an open-loop request.
const noCaller = -1

// refusedBy notes that caller's request was refused (see refusedRTT).
func (s *sim) refusedBy(caller int) {
	if s.refusedRTT == 0 || caller < 0 {
		return
	}
	if s.lastRefused == nil {
		s.lastRefused = map[int]bool{}
	}
	s.lastRefused[caller] = true
}

func (s *sim) answered(caller int) {
	if caller >= 0 && s.onAnswer != nil {
		s.onAnswer(caller)
	}
}

// closed starts n callers at start that send back to back until end:
// each sends its next request one round trip (rtt, 100 µs) after the
// answer to the last.
func (s *sim) closed(n int, start, end time.Duration) { s.closedRamp(n, start, 0, end, 0) }

// closedRamp is closed with the callers starting evenly over ramp (a
// load tool starting its callers one after the other), each request with
// deadline (0: none).
func (s *sim) closedRamp(n int, start, ramp, end, deadline time.Duration) {
	const rtt = 100 * time.Microsecond
	s.onAnswer = func(c int) {
		if s.el < end {
			next := rtt
			if s.lastRefused[c] {
				delete(s.lastRefused, c)
				next = s.refusedRTT
			}
			s.at(s.el+next, func() { s.arrive(c, s.class(), deadline) })
		}
	}
	for c := range n {
		s.at(start+ramp*time.Duration(c)/time.Duration(n), func() { s.arrive(c, s.class(), deadline) })
	}
}

// open sends Poisson arrivals at rate per second from start to end.
func (s *sim) open(rate float64, start, end time.Duration, deadline time.Duration) {
	var next func()
	next = func() {
		if s.el >= end {
			return
		}
		s.arrive(noCaller, s.class(), deadline)
		gap := time.Duration(s.rnd.ExpFloat64() / rate * float64(time.Second))
		s.at(s.el+max(gap, 1), next)
	}
	s.at(start, next)
}

// excess sends open-loop arrivals at share x capacity until from, at
// twice the capacity until to, and at share x capacity again until end,
// each request with a deadline of a second.
func (s *sim) excess(capacity, share float64, from, to, end time.Duration) {
	s.open(share*capacity, 0, from, time.Second)
	s.open(2*capacity, from, to, time.Second)
	s.open(share*capacity, to, end, time.Second)
}

func (s *sim) class() Class {
	if s.classOf == nil {
		return ClassFirst
	}
	return s.classOf()
}

// in returns the results of the requests that arrived in [from, to).
func (s *sim) in(from, to time.Duration) (refused, served int, p99 time.Duration) {
	var lat []time.Duration
	for _, r := range s.results {
		if r.at < from || r.at >= to {
			continue
		}
		if r.refused {
			refused++
		} else {
			served++
			lat = append(lat, r.latency)
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		p99 = lat[int(math.Ceil(0.99*float64(len(lat))))-1]
	}
	return refused, served, p99
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// inTime returns how many requests that arrived in [from, to) were
// answered in time (served before their caller left), and how many
// arrived.
func (s *sim) inTime(from, to time.Duration) (ok, all int) {
	for _, r := range s.results {
		if r.at < from || r.at >= to {
			continue
		}
		all++
		if !r.refused && !r.gone && !r.timedOut {
			ok++
		}
	}
	return ok, all
}
