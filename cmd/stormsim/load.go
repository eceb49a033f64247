package main

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

const (
	// requestTimeout is the deadline of every user request, end to end.
	requestTimeout = 2 * time.Second
	// userPace is how often each user sends a request: the next one
	// leaves userPace after the previous one did, or as soon as its answer
	// comes if that took longer. Paced users keep the offered load the
	// same across modes: a mode that fails fast does not earn more load.
	userPace = 25 * time.Millisecond
	// window is the width of the windows in which recovery is judged.
	window = 100 * time.Millisecond
	// recoveredSuccess is the share of successful requests in a window
	// that counts as recovered.
	recoveredSuccess = 0.99
)

// outcome is one finished user request.
type outcome struct {
	end     time.Time
	latency time.Duration
	ok      bool
}

// recorder collects the outcomes of user requests in the order they end.
type recorder struct {
	ok, failed atomic.Int64 // live counts, for the progress line

	mu       sync.Mutex
	outcomes []outcome
	lastErr  error // the last failure's, for load's summary
}

// failure records err, the error of a failed request.
func (r *recorder) failure(err error) {
	r.mu.Lock()
	r.lastErr = err
	r.mu.Unlock()
}

// lastError returns the last failure's error, or nil.
func (r *recorder) lastError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

func (r *recorder) add(start time.Time, ok bool) {
	r.mu.Lock()
	end := time.Now() // under the lock, so outcomes stay sorted by end
	r.outcomes = append(r.outcomes, outcome{end: end, latency: end.Sub(start), ok: ok})
	r.mu.Unlock()
	if ok {
		r.ok.Add(1)
	} else {
		r.failed.Add(1)
	}
}

func (r *recorder) requests() int64 { return r.ok.Load() + r.failed.Load() }

// since returns the outcomes from index i on.
func (r *recorder) since(i int) []outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i >= len(r.outcomes) {
		return nil
	}
	return slices.Clone(r.outcomes[i:])
}

// summary is what users saw over a set of outcomes.
type summary struct {
	requests int
	success  float64
	p50, p99 time.Duration
}

func summarize(outs []outcome) summary {
	s := summary{requests: len(outs)}
	if len(outs) == 0 {
		return s
	}
	lat := make([]time.Duration, len(outs))
	ok := 0
	for i, o := range outs {
		lat[i] = o.latency
		if o.ok {
			ok++
		}
	}
	slices.Sort(lat)
	s.success = float64(ok) / float64(len(outs))
	s.p50, s.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	return s
}

// percentile returns the nearest-rank percentile p of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// users is a set of paced users sending requests to one client.
type users struct {
	stopStarting context.CancelFunc
	abort        context.CancelFunc
	wg           sync.WaitGroup
}

// startUsers starts n users that send unary requests through cl and record
// them in rec, each request with a deadline of requestTimeout, until
// drain or abort.
func startUsers(cl testsvcv1.TestServiceClient, n int, rec *recorder) *users {
	startCtx, stopStarting := context.WithCancel(context.Background())
	abortCtx, abort := context.WithCancel(context.Background())
	u := &users{stopStarting: stopStarting, abort: abort}
	t0 := time.Now()
	for i := range n {
		u.wg.Go(func() {
			// Spread the users over one pace interval.
			next := t0.Add(time.Duration(i) * userPace / time.Duration(n))
			timer := time.NewTimer(time.Until(next))
			defer timer.Stop()
			req := &testsvcv1.UnaryRequest{Id: "user"}
			for {
				select {
				case <-startCtx.Done():
					return
				case <-timer.C:
				}
				if startCtx.Err() != nil {
					return // select picks at random when both are ready
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(abortCtx, requestTimeout)
				_, err := cl.Unary(ctx, req)
				cancel()
				if abortCtx.Err() != nil {
					return // aborted: the request did not finish on its own
				}
				rec.add(start, err == nil)
				if err != nil {
					rec.failure(err)
				}
				timer.Reset(time.Until(start.Add(userPace)))
			}
		})
	}
	return u
}

// drain stops new requests and waits for the ones in flight to finish (at
// most requestTimeout).
func (u *users) drain() {
	u.stopStarting()
	u.wg.Wait()
	u.abort()
}

// stop stops new requests, cancels the ones in flight (they are not
// recorded), and waits for the users to return.
func (u *users) stop() {
	u.stopStarting()
	u.abort()
	u.wg.Wait()
}

// arrivals sends user requests at a fixed rate, whatever the answers: an
// open loop, as users arrive at a service, where a slow or failing answer
// does not hold the next request back (startUsers is the closed loop).
type arrivals struct {
	stopSending context.CancelFunc
	abort       context.CancelFunc
	sent        chan struct{}  // closed when the last request is sent, or sending stopped
	wg          sync.WaitGroup // the requests in flight
}

// arrivalsBy returns how many requests of an open loop at rate per second
// are due elapsed after its start: one at 0, one every 1/rate s after.
func arrivalsBy(elapsed time.Duration, rate int) int {
	if elapsed < 0 {
		return 0
	}
	return int(int64(elapsed)*int64(rate)/int64(time.Second)) + 1
}

// arrivalsWithin returns how many requests an open loop at rate per
// second sends in total: those due before total, ceil(total x rate).
func arrivalsWithin(total time.Duration, rate int) int {
	return int((int64(total)*int64(rate) + int64(time.Second) - 1) / int64(time.Second))
}

// startArrivals sends arrivalsWithin(total, rate) unary requests through
// cl, each in its own goroutine with a deadline of requestTimeout, on the
// schedule of arrivalsBy, and records them in rec; a late tick sends the
// requests it owes at once. Wait for sent, then drain or stop.
func startArrivals(cl testsvcv1.TestServiceClient, rate int, total time.Duration, rec *recorder) *arrivals {
	ticker := time.NewTicker(max(time.Second/time.Duration(rate), time.Millisecond))
	a := startArrivalsOn(cl, rate, total, rec, clock.Real{}, ticker.C)
	go func() {
		<-a.sent
		ticker.Stop()
	}()
	return a
}

// startArrivalsOn is startArrivals on clk's time, looking at the schedule
// at its start and on every tick.
func startArrivalsOn(cl testsvcv1.TestServiceClient, rate int, total time.Duration, rec *recorder, clk clock.Clock, ticks <-chan time.Time) *arrivals {
	sendCtx, stopSending := context.WithCancel(context.Background())
	abortCtx, abort := context.WithCancel(context.Background())
	a := &arrivals{stopSending: stopSending, abort: abort, sent: make(chan struct{})}
	n := arrivalsWithin(total, rate)
	t0 := clk.Now()
	go func() {
		defer close(a.sent)
		req := &testsvcv1.UnaryRequest{Id: "arrival"}
		for sent := 0; sent < n; {
			for due := min(n, arrivalsBy(clk.Now().Sub(t0), rate)); sent < due; sent++ {
				a.wg.Go(func() {
					start := time.Now()
					ctx, cancel := context.WithTimeout(abortCtx, requestTimeout)
					_, err := cl.Unary(ctx, req)
					cancel()
					if abortCtx.Err() != nil {
						return // aborted: the request did not finish on its own
					}
					rec.add(start, err == nil)
				})
			}
			if sent == n {
				return
			}
			select {
			case <-sendCtx.Done():
				return
			case <-ticks:
			}
		}
	}()
	return a
}

// drain waits for the last request to be sent and for every request in
// flight to end (at most requestTimeout after it was sent).
func (a *arrivals) drain() {
	<-a.sent
	a.wg.Wait()
	a.stopSending()
	a.abort()
}

// stop stops sending, cancels the requests in flight (they are not
// recorded), and waits for them to return.
func (a *arrivals) stop() {
	a.stopSending()
	<-a.sent
	a.abort()
	a.wg.Wait()
}

// recoveryWatch judges, window by window from start, the requests that
// ended in each window. It returns how long after start the first window
// with at least one request and a success rate >= recoveredSuccess ended,
// or -1 if none did within limit or before ctx ended.
func recoveryWatch(ctx context.Context, rec *recorder, start time.Time, limit time.Duration) time.Duration {
	ticker := time.NewTicker(window)
	defer ticker.Stop()
	from := 0 // rec is new for this phase: everything in it ended after start
	var pending []outcome
	for k := 0; time.Duration(k)*window < limit; {
		select {
		case <-ctx.Done():
			return -1
		case <-ticker.C:
		}
		fresh := rec.since(from)
		from += len(fresh)
		pending = append(pending, fresh...)
		// Judge every window that has closed.
		for ; start.Add(time.Duration(k+1)*window).Before(time.Now()) && time.Duration(k)*window < limit; k++ {
			end := start.Add(time.Duration(k+1) * window)
			n, ok := 0, 0
			for len(pending) > 0 && pending[0].end.Before(end) {
				n++
				if pending[0].ok {
					ok++
				}
				pending = pending[1:]
			}
			if n > 0 && float64(ok) >= recoveredSuccess*float64(n) {
				return time.Duration(k+1) * window
			}
		}
	}
	return -1
}
