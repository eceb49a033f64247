package busy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// ChainSpec is a chain to start: one stack on every tier, and each
// tier's work per request.
type ChainSpec struct {
	Stack          string
	Gateway, Order Work
	// Payments has one Work per payment replica; empty means one that
	// does nothing. With several, order sends round_robin over them.
	Payments []Work
	Seed     uint64
}

// Chain is a running chain of tier processes.
type Chain struct {
	// Procs are the payment replicas, then order, then gateway.
	Procs    []*Proc
	payments int
	launcher Launcher
	base     []Counts // at the end of Warm
	// Of the payment processes killed (KillPayment): their counts since
	// Warm and their arrivals, by replica.
	carry []Counts
	gone  [][]Arrivals
}

// StartChain starts the processes of spec, innermost first (each tier
// is connected to the next before it serves).
func StartChain(ctx context.Context, l Launcher, spec ChainSpec) (*Chain, error) {
	pays := spec.Payments
	if len(pays) == 0 {
		pays = []Work{{}}
	}
	c := &Chain{payments: len(pays), launcher: l, carry: make([]Counts, len(pays)), gone: make([][]Arrivals, len(pays))}
	start := func(tier, name string, w Work, seed uint64, next []string) (string, error) {
		flags := append([]string{"--tier", tier, "--stack", spec.Stack, "--seed", strconv.FormatUint(seed, 10)}, w.Args()...)
		if len(next) > 0 {
			flags = append(flags, "--next", strings.Join(next, ","))
		}
		p, err := l.Start(ctx, name, flags...)
		if err != nil {
			return "", err
		}
		c.Procs = append(c.Procs, p)
		return p.Addr, nil
	}
	var payAddrs []string
	for i, w := range pays {
		name := "payment"
		if len(pays) > 1 {
			name = fmt.Sprintf("payment-%d", i+1)
		}
		a, err := start("payment", name, w, spec.Seed+uint64(10+i), nil)
		if err != nil {
			return nil, errors.Join(err, c.Close())
		}
		payAddrs = append(payAddrs, a)
	}
	order, err := start("order", "order", spec.Order, spec.Seed+1, payAddrs)
	if err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if _, err := start("gateway", "gateway", spec.Gateway, spec.Seed, []string{order}); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

// Addr returns the gateway's address: where the load goes.
func (c *Chain) Addr() string { return c.Procs[len(c.Procs)-1].Addr }

// Dial returns a plain client connection to the gateway (no
// interceptors: a user's, like ghz's).
func (c *Chain) Dial() (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+c.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// warmMax bounds the warm-up's requests.
const warmMax = 200

// Warm sends requests one at a time through the chain until every
// payment replica has had one (so that every connection of the chain
// has carried a call; failures count, a replica may fail them all), then
// takes the counters that Counts subtracts.
func (c *Chain) Warm(ctx context.Context) error {
	conn, err := c.Dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	cl := testsvcv1.NewTestServiceClient(conn)
	for sent := 0; ; {
		for range c.payments {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			_, _ = cl.Unary(rctx, &testsvcv1.UnaryRequest{Id: "warm"}, grpc.WaitForReady(true))
			cancel()
			sent++
		}
		counts, err := c.read(ctx)
		if err != nil {
			return err
		}
		reached := 0
		for _, x := range counts[:c.payments] {
			if x.Received > 0 {
				reached++
			}
		}
		if reached == c.payments {
			c.base = counts
			return nil
		}
		if sent >= warmMax || ctx.Err() != nil {
			return fmt.Errorf("warm-up: %d requests reached %d of %d payment replicas", sent, reached, c.payments)
		}
	}
}

func (c *Chain) read(ctx context.Context) ([]Counts, error) {
	out := make([]Counts, len(c.Procs))
	for i, p := range c.Procs {
		var err error
		if out[i], err = p.Counts(ctx); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Counts returns every process's counters since Warm (since the start
// without it), in the order of Procs; a payment replica's include those
// of its processes killed.
func (c *Chain) Counts(ctx context.Context) (ChainCounts, error) {
	now, err := c.read(ctx)
	if err != nil {
		return ChainCounts{}, err
	}
	for i := range now {
		if c.base != nil {
			now[i] = now[i].Sub(c.base[i])
		}
		if i < c.payments {
			now[i] = now[i].Add(c.carry[i])
		}
	}
	return ChainCounts{Tiers: now, Payments: c.payments}, nil
}

// FailPayment makes payment replica i answer every request UNAVAILABLE
// (on), or serve again, and returns when it switched.
func (c *Chain) FailPayment(ctx context.Context, i int, on bool) (time.Time, error) {
	return c.Procs[i].SetFailAll(ctx, on)
}

// SlowPayment switches the share of payment replica i's requests that
// are slow (Work.Slow) to share.
func (c *Chain) SlowPayment(ctx context.Context, i int, share float64) error {
	return c.Procs[i].SetSlow(ctx, share)
}

// KillPayment kills payment replica i's process (SIGKILL), waits for
// its end and returns when it was killed (see Proc.Kill). Its counters and arrivals are read a moment before
// (what arrives in that moment, well under a millisecond, is not
// counted) and kept: Counts and PaymentArrivals include them.
func (c *Chain) KillPayment(ctx context.Context, i int) (time.Time, error) {
	p := c.Procs[i]
	final, err := p.Counts(ctx)
	if err != nil {
		return time.Time{}, err
	}
	arr, err := p.Arrivals(ctx)
	if err != nil {
		return time.Time{}, err
	}
	at, err := p.Kill()
	if err != nil {
		return time.Time{}, err
	}
	if c.base != nil {
		final = final.Sub(c.base[i])
		c.base[i] = Counts{} // the next process counts from zero
	}
	c.carry[i] = final.Add(c.carry[i])
	c.gone[i] = append(c.gone[i], arr)
	return at, nil
}

// RestartPayment starts payment replica i again, after KillPayment, with
// the same flags on the same address, and returns when it began to start
// it and when it served (printed its address).
func (c *Chain) RestartPayment(ctx context.Context, i int) (began, serving time.Time, err error) {
	old := c.Procs[i]
	began = time.Now().Round(0)
	p, err := c.launcher.Start(ctx, old.Name, append(slices.Clone(old.flags), "--listen", old.Addr)...)
	if err != nil {
		return began, time.Time{}, err
	}
	serving = time.Now().Round(0)
	c.Procs[i] = p
	if p.Addr != old.Addr {
		return began, serving, fmt.Errorf("%s restarted on %s, want %s", p.Name, p.Addr, old.Addr)
	}
	return began, serving, nil
}

// PaymentArrivals returns the arrivals series of every payment process
// of the run, the killed ones included.
func (c *Chain) PaymentArrivals(ctx context.Context) ([]Arrivals, error) {
	var out []Arrivals
	for i := range c.payments {
		a, err := c.Procs[i].Arrivals(ctx)
		if err != nil {
			return nil, err
		}
		out = append(append(out, c.gone[i]...), a)
	}
	return out, nil
}

// Close stops every process, outermost first, and reports the first that
// failed.
func (c *Chain) Close() error {
	var errs []error
	for i := len(c.Procs) - 1; i >= 0; i-- {
		errs = append(errs, c.Procs[i].Stop())
	}
	return errors.Join(errs...)
}

// ChainCounts are the counters of every process of a chain.
type ChainCounts struct {
	// Tiers: the payment replicas, then order, then gateway.
	Tiers    []Counts
	Payments int
}

// Total returns the sum over every process.
func (cc ChainCounts) Total() Counts {
	var t Counts
	for _, c := range cc.Tiers {
		t = t.Add(c)
	}
	t.Tier = "all"
	return t
}

// Payment returns the counters of each payment replica.
func (cc ChainCounts) Payment() []Counts { return cc.Tiers[:cc.Payments] }
