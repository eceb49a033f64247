package testsvc

import (
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// Three replicas of payment behind round_robin: once every replica is
// connected, sequential calls rotate over them exactly, each replica
// counts its own calls and has its own faults, and the first replica
// counts the hop's attempts to all of them.
func TestReplicasRoundRobin(t *testing.T) {
	var replicaOpts atomic.Int64
	c := New(t, Config{Replicas: 3, ReplicaServerOptions: func(r int) []grpc.ServerOption {
		replicaOpts.Add(int64(r))
		return nil
	}})
	if got := replicaOpts.Load(); got != 1+2 {
		t.Errorf("ReplicaServerOptions called for replicas summing to %d, want 1 + 2", got)
	}
	reps := c.Replicas("payment")
	if len(reps) != 3 || reps[0] != c.Tier("payment") || len(c.Replicas("order")) != 1 || c.Replicas("nope") != nil {
		t.Fatalf("Replicas: payment %d, order %d, nope %v", len(reps), len(c.Replicas("order")), c.Replicas("nope"))
	}
	for i, r := range reps {
		if r.Replica() != i || r.Name() != "payment" {
			t.Errorf("replica %d: Replica() %d, Name() %q", i, r.Replica(), r.Name())
		}
	}
	ctx := ctxT(t, 20*time.Second)
	cl := c.Client()
	call := func() error {
		_, err := cl.Unary(ctx, &testsvcv1.UnaryRequest{Id: "r"})
		return err
	}
	// Picks go to connected replicas only: call until each has served.
	for reps[0].Received(Unary) == 0 || reps[1].Received(Unary) == 0 || reps[2].Received(Unary) == 0 {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range reps {
		r.ResetCounts()
	}
	reps[2].SetDown(codes.Unavailable)
	failed := 0
	for range 30 {
		if err := call(); status.Code(err) == codes.Unavailable {
			failed++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range reps {
		if got := r.Received(Unary); got != 10 {
			t.Errorf("replica %d received %d calls, want 10 of 30", i, got)
		}
	}
	if failed != 10 {
		t.Errorf("%d of 30 calls failed with one replica of 3 down, want 10", failed)
	}
	if got := reps[0].Attempts(Unary); got != 30 {
		t.Errorf("attempts counted at the first replica: %d, want 30", got)
	}
	if got := reps[1].Attempts(Unary) + reps[2].Attempts(Unary); got != 0 {
		t.Errorf("attempts counted at the other replicas: %d, want 0", got)
	}
}

func TestReplicasBounds(t *testing.T) {
	for _, n := range []int{-1, maxReplicas + 1} {
		if c, err := Start(Config{Replicas: n}); err == nil {
			c.Close()
			t.Errorf("Start with %d replicas: no error", n)
		}
	}
}
