package busy

import (
	"context"
	"errors"
	"fmt"
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
	base     []Counts // at the end of Warm
}

// StartChain starts the processes of spec, innermost first (each tier
// is connected to the next before it serves).
func StartChain(ctx context.Context, l Launcher, spec ChainSpec) (*Chain, error) {
	pays := spec.Payments
	if len(pays) == 0 {
		pays = []Work{{}}
	}
	c := &Chain{payments: len(pays)}
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
// without it), in the order of Procs.
func (c *Chain) Counts(ctx context.Context) (ChainCounts, error) {
	now, err := c.read(ctx)
	if err != nil {
		return ChainCounts{}, err
	}
	if c.base != nil {
		for i := range now {
			now[i] = now[i].Sub(c.base[i])
		}
	}
	return ChainCounts{Tiers: now, Payments: c.payments}, nil
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
