package testsvc

import (
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Pool makes the last tier serve its unary calls from a bounded worker
// pool with a FIFO queue that ignores cancellation, like a server whose
// requests wait for a thread: every call is queued, waits for a worker,
// takes Service of it, and its handler returns only then, even when its
// caller has gone (the work is done, wasted).
type Pool struct {
	// Workers is the number of calls served at once; at least 1.
	Workers int
	// Service is the time a worker takes per call.
	Service time.Duration
}

// pool is a running Pool.
type pool struct {
	jobs    chan chan struct{} // FIFO of the calls' done channels
	service atomic.Int64       // nanoseconds
	served  atomic.Int64
	quit    chan struct{}
	wg      sync.WaitGroup
}

// maxQueue bounds the queue; beyond it calls fail with UNAVAILABLE.
const maxQueue = 1 << 16

// SetPool starts a worker pool for the tier's unary calls (see Pool),
// replacing any earlier one. Call StopPool when done: it stops the
// workers.
func (t *Tier) SetPool(p Pool) {
	np := &pool{jobs: make(chan chan struct{}, maxQueue), quit: make(chan struct{})}
	np.service.Store(int64(max(p.Service, 0)))
	for range max(p.Workers, 1) {
		np.wg.Go(np.work)
	}
	if old := t.faults.pool.Swap(np); old != nil {
		old.stop()
	}
}

// SetService changes the service time of the running pool, for a
// slowdown; calls already being served keep theirs.
func (t *Tier) SetService(d time.Duration) {
	if p := t.faults.pool.Load(); p != nil {
		p.service.Store(int64(max(d, 0)))
	}
}

// Served returns the number of calls the pool's workers finished.
func (t *Tier) Served() int64 {
	if p := t.faults.pool.Load(); p != nil {
		return p.served.Load()
	}
	return 0
}

// StopPool stops the pool: its workers end, and calls still queued fail
// with UNAVAILABLE.
func (t *Tier) StopPool() {
	if p := t.faults.pool.Swap(nil); p != nil {
		p.stop()
	}
}

func (p *pool) stop() {
	close(p.quit)
	p.wg.Wait()
}

func (p *pool) work() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-p.quit:
			return
		case done := <-p.jobs:
			timer.Reset(time.Duration(p.service.Load()))
			select {
			case <-timer.C:
			case <-p.quit:
				timer.Stop()
				return
			}
			p.served.Add(1)
			close(done)
		}
	}
}

// serve queues one call and waits for a worker to finish it, whatever the
// caller does. With no pool it returns at once.
func (f *faults) serve() error {
	p := f.pool.Load()
	if p == nil {
		return nil
	}
	done := make(chan struct{})
	select {
	case p.jobs <- done:
	default:
		return status.Error(codes.Unavailable, "injected: pool queue full")
	}
	select {
	case <-done:
		return nil
	case <-p.quit:
		return status.Error(codes.Unavailable, "injected: pool stopped")
	}
}
