package bench

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/loadgen"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Params sizes the scenarios. DefaultParams keeps a run of every scenario
// for every stack within a few minutes on 2 cores.
type Params struct {
	Seed uint64

	// Payment down, sustained: Users closed-loop users for DownFor.
	Users   int
	DownFor time.Duration
	// Deadline of a user request in the closed-loop scenarios.
	Deadline time.Duration

	// Payment flaky: FlakyRequests requests from Users users.
	FlakyRequests int

	// Capacity drop: open-loop arrivals at Rate per second; payment takes
	// Capacity per second, a fifth of it from CapBefore for CapDuring,
	// then all of it again for CapAfter.
	Rate        int
	Capacity    int64
	CapBefore   time.Duration
	CapDuring   time.Duration
	CapAfter    time.Duration
	CapDeadline time.Duration

	// Kill and restart: KillUsers closed-loop users with KillDeadline per
	// request; payment is killed after KillWarmup, restarted KillFor
	// later, and watched for KillWatch after the restart.
	KillUsers    int
	KillDeadline time.Duration
	KillWarmup   time.Duration
	KillFor      time.Duration
	KillWatch    time.Duration
}

// DefaultParams are the sizes of `make bench`.
var DefaultParams = Params{
	Seed:          42,
	Users:         32,
	DownFor:       2 * time.Second,
	Deadline:      5 * time.Second,
	FlakyRequests: 4000,
	Rate:          300,
	Capacity:      500,
	CapBefore:     time.Second,
	CapDuring:     2 * time.Second,
	CapAfter:      2 * time.Second,
	CapDeadline:   2 * time.Second,
	KillUsers:     16,
	KillDeadline:  time.Second,
	KillWarmup:    200 * time.Millisecond,
	KillFor:       3 * time.Second,
	KillWatch:     6 * time.Second,
}

// start starts a fresh chain with a fresh instance of stack.
func start(stack Stack, seed uint64) (*testsvc.Chain, *Instance, error) {
	inst, err := stack.New(nil, seed)
	if err != nil {
		return nil, nil, err
	}
	c, err := testsvc.Start(inst.Config)
	if err != nil {
		return nil, nil, err
	}
	if err := warm(c); err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, inst, nil
}

// warm connects every hop and zeroes the counters (loadgen.Warm).
func warm(c *testsvc.Chain) error { return loadgen.Warm(c) }

func unary(t *testsvc.Tier) int64     { return t.Received(testsvc.Unary) }
func attempted(t *testsvc.Tier) int64 { return t.Attempts(testsvc.Unary) }

// DownOne is payment down, one user request.
type DownOne struct {
	Received [3]int64 // calls received at gateway, order, payment
	Code     codes.Code
	Latency  time.Duration
}

// RunDownOne sends one request with payment down.
func RunDownOne(stack Stack, p Params) (DownOne, error) {
	c, _, err := start(stack, p.Seed)
	if err != nil {
		return DownOne{}, err
	}
	defer c.Close()
	c.Tier("payment").SetDown(codes.Unavailable)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	begin := time.Now()
	_, err = c.Client().Unary(ctx, &testsvcv1.UnaryRequest{Id: "one"})
	r := DownOne{Code: status.Code(err), Latency: time.Since(begin)}
	for i, t := range c.Tiers() {
		r.Received[i] = unary(t)
	}
	return r, nil
}

// Load is what users saw under a load, with the calls payment received.
type Load struct {
	Samples Samples
	Payment int64    // calls received at payment
	Opens   [3]int64 // breaker openings per hop
}

// PerRequest returns the calls at payment per user request.
func (l Load) PerRequest() float64 {
	if len(l.Samples) == 0 {
		return 0
	}
	return float64(l.Payment) / float64(len(l.Samples))
}

// RunDownSustained runs closed-loop users for p.DownFor with payment down.
func RunDownSustained(stack Stack, p Params) (Load, error) {
	c, inst, err := start(stack, p.Seed)
	if err != nil {
		return Load{}, err
	}
	defer c.Close()
	pay := c.Tier("payment")
	pay.SetDown(codes.Unavailable)
	stop := make(chan struct{})
	timer := time.AfterFunc(p.DownFor, func() { close(stop) })
	defer timer.Stop()
	s := ClosedLoop(c, p.Users, 0, p.Deadline, stop)
	return Load{Samples: s, Payment: unary(pay), Opens: inst.BreakerOpens()}, nil
}

// RunFlaky sends p.FlakyRequests requests with payment failing at random
// with probability prob (seeded).
func RunFlaky(stack Stack, p Params, prob float64) (Load, error) {
	c, inst, err := start(stack, p.Seed)
	if err != nil {
		return Load{}, err
	}
	defer c.Close()
	pay := c.Tier("payment")
	pay.SetFlaky(prob)
	s := ClosedLoop(c, p.Users, p.FlakyRequests, p.Deadline, nil)
	return Load{Samples: s, Payment: unary(pay), Opens: inst.BreakerOpens()}, nil
}

// Phase is one phase of the capacity drop.
type Phase struct {
	Samples Samples // requests that arrived in the phase
	Payment int64   // calls payment received during the phase
}

// PerRequest returns the calls at payment per user request of the phase.
func (ph Phase) PerRequest() float64 {
	if len(ph.Samples) == 0 {
		return 0
	}
	return float64(ph.Payment) / float64(len(ph.Samples))
}

// CapacityDrop is the capacity-drop scenario, phase by phase.
type CapacityDrop struct {
	Before, During, After Phase
	Opens                 [3]int64
}

// RunCapacityDrop sends open-loop arrivals at p.Rate per second; payment
// takes p.Capacity calls per second, a fifth of that during the drop.
func RunCapacityDrop(stack Stack, p Params) (CapacityDrop, error) {
	c, inst, err := start(stack, p.Seed)
	if err != nil {
		return CapacityDrop{}, err
	}
	defer c.Close()
	pay := c.Tier("payment")
	pay.SetCapacity(testsvc.Capacity{PerSecond: p.Capacity})
	// Start on a second boundary, so that the drop starts and ends on
	// boundaries of payment's per-second capacity counter.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	dropAt, backAt := p.CapBefore, p.CapBefore+p.CapDuring
	total := backAt + p.CapAfter
	var marks [2]int64
	phase := 0
	s := OpenLoop(c, p.Rate, total, p.CapDeadline, func(elapsed time.Duration) {
		switch {
		case phase == 0 && elapsed >= dropAt:
			marks[0] = unary(pay)
			pay.SetCapacity(testsvc.Capacity{PerSecond: max(p.Capacity/5, 1)})
			phase = 1
		case phase == 1 && elapsed >= backAt:
			marks[1] = unary(pay)
			pay.SetCapacity(testsvc.Capacity{PerSecond: p.Capacity})
			phase = 2
		}
	})
	end := unary(pay)
	return CapacityDrop{
		Before: Phase{Samples: s.Between(0, dropAt), Payment: marks[0]},
		During: Phase{Samples: s.Between(dropAt, backAt), Payment: marks[1] - marks[0]},
		After:  Phase{Samples: s.Between(backAt, total), Payment: end - marks[1]},
		Opens:  inst.BreakerOpens(),
	}, nil
}

// KillRestart is the kill-and-restart scenario.
type KillRestart struct {
	Killed   Samples // requests that started while payment was killed
	Attempts int64   // attempts order sent to payment while it was killed
	// Recovery is the time from the restart to the start of the first
	// 100 ms bucket from which every bucket for a second has >= 99 %
	// success; negative when that never happened within KillWatch.
	Recovery time.Duration
	Opens    [3]int64
}

// recoveryBucket and recoveryStreak define "back to >= 99 % success".
const (
	recoveryBucket = 100 * time.Millisecond
	recoveryStreak = 10
)

// RunKillRestart kills payment under closed-loop load and restarts it.
func RunKillRestart(stack Stack, p Params) (KillRestart, error) {
	c, inst, err := start(stack, p.Seed)
	if err != nil {
		return KillRestart{}, err
	}
	defer c.Close()
	pay := c.Tier("payment")
	stop := make(chan struct{})
	var killAt, restartAt time.Duration
	var attemptsAtKill, attemptsAtRestart int64
	done := make(chan struct{})
	col := newCollector()
	begin := col.Start()
	go func() {
		defer close(done)
		<-time.After(p.KillWarmup)
		attemptsAtKill = attempted(pay)
		killAt = time.Since(begin)
		pay.Kill()
		<-time.After(p.KillFor)
		attemptsAtRestart = attempted(pay)
		restartAt = time.Since(begin)
		pay.Restart()
		<-time.After(p.KillWatch)
		close(stop)
	}()
	s := closedLoop(col, c, p.KillUsers, 0, p.KillDeadline, stop)
	<-done
	r := KillRestart{
		Killed:   s.Between(killAt, restartAt),
		Attempts: attemptsAtRestart - attemptsAtKill,
		Recovery: recovery(s, restartAt, restartAt+p.KillWatch),
		Opens:    inst.BreakerOpens(),
	}
	return r, nil
}

// recovery returns the time from restart to the start of the first bucket
// of a streak of recoveryStreak buckets with >= 99 % success each, or -1.
func recovery(s Samples, restart, end time.Duration) time.Duration {
	n := int((end - restart) / recoveryBucket)
	good := make([]bool, n)
	for i := range n {
		from := restart + time.Duration(i)*recoveryBucket
		b := s.Between(from, from+recoveryBucket)
		good[i] = len(b) > 0 && b.Success() >= 0.99
	}
	for i := 0; i+recoveryStreak <= n; i++ {
		all := true
		for j := i; j < i+recoveryStreak; j++ {
			if !good[j] {
				all = false
				break
			}
		}
		if all {
			return time.Duration(i) * recoveryBucket
		}
	}
	return -1
}
