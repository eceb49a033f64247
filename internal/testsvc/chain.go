// Package testsvc runs the gateway -> order -> payment chain of the test
// service over bufconn, with fault injection and per-tier call counts, for
// the tests and the demo.
//
// Every tier forwards each call to the next tier with the incoming context
// and returns the downstream status on failure; the last tier answers. The
// caller sets each hop's dial options and each tier's server options, so
// any retry stack can be put on the chain and counted.
package testsvc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/test/bufconn"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// DefaultTiers are the tiers of the chain when Config.Tiers is empty.
var DefaultTiers = []string{"gateway", "order", "payment"}

const bufSize = 1 << 20

// Kind is the kind of an RPC of the test service.
type Kind int

// The four kinds of RPC, one method of the test service each.
const (
	Unary Kind = iota
	ServerStream
	ClientStream
	Bidi
	numKinds
)

var kindNames = [numKinds]string{"unary", "server_stream", "client_stream", "bidi"}

func (k Kind) String() string {
	if k < 0 || k >= numKinds {
		return fmt.Sprintf("Kind(%d)", int(k))
	}
	return kindNames[k]
}

func kindOf(fullMethod string) (Kind, bool) {
	switch fullMethod {
	case testsvcv1.TestService_Unary_FullMethodName:
		return Unary, true
	case testsvcv1.TestService_ServerStream_FullMethodName:
		return ServerStream, true
	case testsvcv1.TestService_ClientStream_FullMethodName:
		return ClientStream, true
	case testsvcv1.TestService_Bidi_FullMethodName:
		return Bidi, true
	}
	return 0, false
}

// Config says how to build a chain. The zero value is the default
// three-tier chain with no interceptors.
type Config struct {
	// Tiers names the tiers from the edge inward. Empty means DefaultTiers.
	Tiers []string
	// DialOptions returns extra dial options for hop i: the client that
	// calls Tiers[i]. Hop 0 is the edge client; hop i > 0 is the client
	// inside Tiers[i-1]. Nil means none.
	DialOptions func(hop int) []grpc.DialOption
	// ServerOptions returns extra server options for Tiers[i]. Nil means
	// none. They are applied again on every restart.
	ServerOptions func(tier int) []grpc.ServerOption
	// Register, if not nil, registers extra services on Tiers[i]'s server
	// (a health server that a stack watches), on every start, after the
	// test service. Nil means none.
	Register func(tier int, srv *grpc.Server)
	// Seed seeds the random fault source; tier i uses Seed + i (replica
	// r > 0 of the last tier: Seed + i + r<<32).
	Seed uint64
	// Replicas is the number of replicas of the last tier; 0 or 1 means
	// one. With more, each replica is a server of its own (own faults,
	// own counts, own listener), and the hop in front of them dials all
	// of them through a manual resolver and balances round_robin over
	// them. Chain.Replicas returns them; Chain.Tier and Chain.Tiers
	// return the first.
	Replicas int
	// ReplicaServerOptions, if not nil, returns the server options of
	// replica r >= 1 of the last tier (Replicas > 1), in place of
	// ServerOptions(last): each replica stands for a process of its own,
	// with interceptors of its own. Nil means ServerOptions(last) for
	// every replica.
	ReplicaServerOptions func(replica int) []grpc.ServerOption
	// Bare leaves out the chain's own interceptors, which count attempts
	// and failures and inject the latency and capacity faults: with them,
	// any interceptor of a stack makes a chain of two, which costs grpc-go
	// a closure per call on each side. For overhead benchmarks: a bare
	// chain's Attempts and Failed stay zero, and SetLatency and
	// SetCapacity do nothing.
	Bare bool
}

// maxReplicas bounds Config.Replicas.
const maxReplicas = 64

// roundRobin is the service config of the hop in front of replicas.
const roundRobin = `{"loadBalancingConfig":[{"round_robin":{}}]}`

// Chain is a running chain of tiers plus the edge client.
type Chain struct {
	tiers    []*Tier
	replicas []*Tier // of the last tier, the first of them tiers[len-1]; nil with one
	edge     *grpc.ClientConn
	hops     []*grpc.ClientConn // hops[i] calls tiers[i]
	once     sync.Once
}

// New starts a chain and registers its teardown with tb.Cleanup. It fails
// the test if the chain cannot start.
func New(tb testing.TB, cfg Config) *Chain {
	tb.Helper()
	c, err := Start(cfg)
	if err != nil {
		tb.Fatalf("testsvc: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Start starts a chain. The caller must call Close.
func Start(cfg Config) (*Chain, error) {
	names := cfg.Tiers
	if len(names) == 0 {
		names = DefaultTiers
	}
	if cfg.Replicas < 0 || cfg.Replicas > maxReplicas {
		return nil, fmt.Errorf("testsvc: %d replicas: want 0 to %d", cfg.Replicas, maxReplicas)
	}
	c := &Chain{hops: make([]*grpc.ClientConn, len(names))}
	newTier := func(i, replica int) *Tier {
		t := &Tier{name: names[i], index: i, replica: replica, bare: cfg.Bare, faults: newFaults(cfg.Seed + uint64(i) + uint64(replica)<<32)}
		switch {
		case replica > 0 && cfg.ReplicaServerOptions != nil:
			t.serverOpts = cfg.ReplicaServerOptions(replica)
		case cfg.ServerOptions != nil:
			t.serverOpts = cfg.ServerOptions(i)
		}
		if cfg.Register != nil {
			t.register = func(srv *grpc.Server) { cfg.Register(i, srv) }
		}
		return t
	}
	for i := range names {
		c.tiers = append(c.tiers, newTier(i, 0))
	}
	if cfg.Replicas > 1 {
		last := len(names) - 1
		c.replicas = []*Tier{c.tiers[last]}
		for r := 1; r < cfg.Replicas; r++ {
			t := newTier(last, r)
			c.replicas = append(c.replicas, t)
			t.Restart()
		}
	}
	// Connect from the innermost tier outwards, so that each tier's
	// downstream client exists before the tier serves.
	for i := len(c.tiers) - 1; i >= 0; i-- {
		t := c.tiers[i]
		if i+1 < len(c.tiers) {
			conn, err := c.dial(cfg, i+1)
			if err != nil {
				c.Close()
				return nil, err
			}
			t.next = testsvcv1.NewTestServiceClient(conn)
		}
		t.Restart()
	}
	edge, err := c.dial(cfg, 0)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.edge = edge
	return c, nil
}

// dial connects hop i to tier i. Reconnection backoff is short, so that a
// restarted tier is reachable again within tens of milliseconds; the
// caller's options come after ours and win.
func (c *Chain) dial(cfg Config, hop int) (*grpc.ClientConn, error) {
	t := c.tiers[hop]
	target := "passthrough:///" + t.name
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  10 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   100 * time.Millisecond,
			},
			MinConnectTimeout: time.Second,
		}),
	}
	if hop == len(c.tiers)-1 && len(c.replicas) > 1 {
		// Every replica by its address, round_robin over them.
		r := manual.NewBuilderWithScheme("testsvc")
		eps := make([]resolver.Endpoint, len(c.replicas))
		for i, rep := range c.replicas {
			eps[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: rep.addr()}}}
		}
		r.InitialState(resolver.State{Endpoints: eps})
		target = "testsvc:///" + t.name
		opts = append(opts, grpc.WithResolvers(r), grpc.WithContextDialer(c.dialReplica),
			grpc.WithDefaultServiceConfig(roundRobin))
	} else {
		opts = append(opts, grpc.WithContextDialer(t.dial))
	}
	if cfg.DialOptions != nil {
		opts = append(opts, cfg.DialOptions(hop)...)
	}
	// Innermost: count every attempt that leaves this hop, after any retry
	// interceptor the caller installed.
	if !cfg.Bare {
		opts = append(opts,
			grpc.WithChainUnaryInterceptor(t.countAttemptUnary),
			grpc.WithChainStreamInterceptor(t.countAttemptStream),
		)
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", t.name, err)
	}
	c.hops[hop] = conn
	return conn, nil
}

// Client returns the edge client: the user's view of the chain.
func (c *Chain) Client() testsvcv1.TestServiceClient {
	return testsvcv1.NewTestServiceClient(c.edge)
}

// Conn returns the client connection of hop i, which calls Tiers()[i]:
// hop 0 is the edge client's. Tests use it to wait for a reconnect.
func (c *Chain) Conn(hop int) *grpc.ClientConn { return c.hops[hop] }

// Tiers returns the tiers from the edge inward (of the last tier with
// Config.Replicas > 1, its first replica).
func (c *Chain) Tiers() []*Tier { return c.tiers }

// Replicas returns the replicas of the tier with the given name: all of
// them for the last tier with Config.Replicas > 1, otherwise the tier
// alone; nil for no such tier.
func (c *Chain) Replicas(name string) []*Tier {
	if last := c.tiers[len(c.tiers)-1]; len(c.replicas) > 1 && last.name == name {
		return c.replicas
	}
	if t := c.Tier(name); t != nil {
		return []*Tier{t}
	}
	return nil
}

// dialReplica connects to the replica whose address addr is.
func (c *Chain) dialReplica(ctx context.Context, addr string) (net.Conn, error) {
	for _, t := range c.replicas {
		if t.addr() == addr {
			return t.dial(ctx, addr)
		}
	}
	return nil, fmt.Errorf("testsvc: no replica at %q", addr)
}

// Tier returns the tier with the given name, or nil.
func (c *Chain) Tier(name string) *Tier {
	for _, t := range c.tiers {
		if t.name == name {
			return t
		}
	}
	return nil
}

// Close stops every server and closes every client. It is safe to call
// more than once.
func (c *Chain) Close() {
	c.once.Do(func() {
		for _, conn := range c.hops {
			if conn != nil {
				_ = conn.Close()
			}
		}
		for _, t := range c.tiers {
			t.Kill()
		}
		for _, t := range c.replicas {
			t.Kill()
		}
	})
}

// Tier is one service of the chain.
type Tier struct {
	name    string
	index   int
	replica int // its index among the replicas of its tier; 0 for the first or only

	received [numKinds]atomic.Int64
	attempts [numKinds]atomic.Int64
	failed   atomic.Int64

	faults      *faults
	streamFault atomic.Pointer[streamFault]
	next        testsvcv1.TestServiceClient // nil for the last tier

	serverOpts []grpc.ServerOption
	register   func(*grpc.Server) // nil: no extra services
	bare       bool               // Config.Bare

	mu  sync.Mutex
	lis *bufconn.Listener // nil while killed
	srv *grpc.Server
}

// Name returns the tier's name (the same for every replica).
func (t *Tier) Name() string { return t.name }

// Replica returns the tier's index among the replicas of its tier
// (Config.Replicas), 0 for the first or only one.
func (t *Tier) Replica() int { return t.replica }

// addr is the replica's address for the resolver of the hop in front.
func (t *Tier) addr() string { return fmt.Sprintf("%s/%d", t.name, t.replica) }

// Received returns the number of calls of kind k that reached this tier's
// server (every arrival, including calls the faults refused).
func (t *Tier) Received(k Kind) int64 { return t.received[k].Load() }

// ReceivedAll returns the number of calls of every kind that reached this
// tier's server.
func (t *Tier) ReceivedAll() int64 {
	var n int64
	for k := range numKinds {
		n += t.received[k].Load()
	}
	return n
}

// Attempts returns the number of calls of kind k that the hop in front of
// this tier sent, counted in the client after all of its interceptors. It
// differs from Received when calls fail before they reach the server, for
// example while the tier is killed. With replicas, the first replica
// counts the hop's attempts to all of them, the others none.
func (t *Tier) Attempts(k Kind) int64 { return t.attempts[k].Load() }

// Failed returns the number of calls this tier answered with an error.
func (t *Tier) Failed() int64 { return t.failed.Load() }

// ResetCounts sets every counter of the tier to zero.
func (t *Tier) ResetCounts() {
	for k := range numKinds {
		t.received[k].Store(0)
		t.attempts[k].Store(0)
	}
	t.failed.Store(0)
}

// SetDown makes every call fail with code until SetUp. codes.OK means
// codes.Unavailable.
func (t *Tier) SetDown(code codes.Code) {
	if code == codes.OK {
		code = codes.Unavailable
	}
	t.faults.down.Store(int32(code) + 1)
}

// SetUp ends SetDown.
func (t *Tier) SetUp() { t.faults.down.Store(0) }

// SetFlaky makes each call fail with UNAVAILABLE with probability p, drawn
// from the tier's seeded random source. p is clamped to [0, 1].
func (t *Tier) SetFlaky(p float64) {
	if math.IsNaN(p) || p < 0 {
		p = 0
	}
	t.faults.flakyP.Store(math.Float64bits(min(p, 1)))
}

// SetLatency delays every admitted call by d before it is served. The delay
// ends early when the call's context ends.
func (t *Tier) SetLatency(d time.Duration) { t.faults.latency.Store(int64(max(d, 0))) }

// SetTail makes a share p of the admitted calls, drawn at random from the
// tier's seeded source, wait d instead of SetLatency's delay: a slow tail
// (a garbage collection, a cold cache, a slow disk). p is clamped to
// [0, 1]; 0 ends it.
func (t *Tier) SetTail(p float64, d time.Duration) {
	if math.IsNaN(p) || p < 0 {
		p = 0
	}
	t.faults.tail.Store(int64(max(d, 0)))
	t.faults.tailP.Store(math.Float64bits(min(p, 1)))
}

// SetCapacity sheds calls beyond c with UNAVAILABLE. The zero Capacity
// removes the limit.
func (t *Tier) SetCapacity(c Capacity) {
	t.faults.capMu.Lock()
	t.faults.capacity = c
	t.faults.capMu.Unlock()
}

// SetStreamFault makes this tier's streams fail part-way, when it is the
// last tier (the one that answers). The zero StreamFault with Streams 0
// would fail every stream at once; use ClearStreamFault to end it.
func (t *Tier) SetStreamFault(f StreamFault) {
	sf := &streamFault{f: f}
	sf.remaining.Store(int64(f.Streams))
	t.streamFault.Store(sf)
}

// ClearStreamFault ends SetStreamFault.
func (t *Tier) ClearStreamFault() { t.streamFault.Store(nil) }

// Kill stops the tier's server at once, as a crash would: connections
// close, calls in flight fail, and new calls fail to connect until Restart.
func (t *Tier) Kill() {
	t.mu.Lock()
	srv, lis := t.srv, t.lis
	t.srv, t.lis = nil, nil
	t.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	if lis != nil {
		_ = lis.Close()
	}
}

// Restart brings the tier up on a fresh listener (after killing the
// current server, if any). Clients reconnect on their own.
func (t *Tier) Restart() {
	t.Kill()
	lis := bufconn.Listen(bufSize)
	var opts []grpc.ServerOption
	if !t.bare {
		opts = append(opts, grpc.ChainUnaryInterceptor(t.admitUnary), grpc.ChainStreamInterceptor(t.admitStream))
	}
	opts = append(opts, t.serverOpts...)
	srv := grpc.NewServer(opts...)
	testsvcv1.RegisterTestServiceServer(srv, &handler{tier: t})
	testsvcv1.RegisterStatsServiceServer(srv, &statsHandler{tier: t})
	if t.register != nil {
		t.register(srv)
	}
	t.mu.Lock()
	t.srv, t.lis = srv, lis
	t.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
}

var errKilled = errors.New("testsvc: tier is killed (connection refused)")

func (t *Tier) dial(ctx context.Context, _ string) (net.Conn, error) {
	t.mu.Lock()
	lis := t.lis
	t.mu.Unlock()
	if lis == nil {
		return nil, errKilled
	}
	return lis.DialContext(ctx)
}
