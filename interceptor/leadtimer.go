package interceptor

import (
	"sync"
	"sync/atomic"
	"time"
)

// leadTimer is the wait of a hedged call's lead attempt for its first
// hedge, on the real clock. Most leads answer before their hedge delay,
// and a wait stopped before it expired goes back to a pool, so that a
// hedged call that sends no hedge allocates no timer (time.AfterFunc
// makes two allocations: the timer and its function).
//
// A wait that expired is never reused: its function may still be on its
// way to run. The call and the lead it waits for are atomics because the
// function reads them on the timer's goroutine, after a Reset by
// another goroutine than the one that made the timer.
type leadTimer struct {
	t   *time.Timer
	h   atomic.Pointer[hedgeCall]
	gen atomic.Uint64
}

var leadTimers sync.Pool

// startLeadTimer starts the wait of lead gen of call h: after d, the
// timer's goroutine runs h.coordinate(gen).
func startLeadTimer(d time.Duration, h *hedgeCall, gen uint64) *leadTimer {
	lt, _ := leadTimers.Get().(*leadTimer)
	if lt == nil {
		lt = new(leadTimer)
	}
	lt.h.Store(h)
	lt.gen.Store(gen)
	if lt.t == nil {
		lt.t = time.AfterFunc(d, lt.fire)
	} else {
		lt.t.Reset(d)
	}
	return lt
}

func (lt *leadTimer) fire() { lt.h.Load().coordinate(lt.gen.Load()) }

// Stop stops the wait, and reports whether it stopped it before it
// expired: then its function never runs, and the timer goes back to the
// pool. The caller must not use lt after Stop.
func (lt *leadTimer) Stop() bool {
	if !lt.t.Stop() {
		return false
	}
	lt.h.Store(nil)
	leadTimers.Put(lt)
	return true
}
