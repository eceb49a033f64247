package interceptor

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/internal/clock"
)

// suspect makes l suspect: arrivals exceed completions (Acquire, which
// holds no one, lets them all in). It returns the permits still in
// flight.
func suspect(t *testing.T, l *admission.Limiter, clk *clock.Fake) []admission.Permit {
	t.Helper()
	var in []admission.Permit
	for i := 0; !l.Suspect(); i++ {
		if i == 100 || l.Overloaded() {
			t.Fatalf("not suspect after %d s of 40 arrivals and 10 completions a second: %+v", i, l.Stats())
		}
		for range 40 {
			p, err := l.Acquire(admission.ClassFirst, time.Time{})
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			in = append(in, p)
		}
		clk.Advance(time.Second)
		for _, p := range in[:10] {
			p.Release(admission.Measured)
		}
		in = in[10:]
	}
	return in
}

// A tier that receives the held mark admits the request at once, beyond
// its own full suspect cap, and passes the mark on: a request is held
// once, by the tier above (protocol section 2.7). A request that this
// tier admits in a suspect phase whose cap did not grow because the work
// became slower (here: arrivals simply exceed completions) is not
// marked (admission's TestHeldOnlyWhereTheWorkBecameSlower has the
// cases that are), nor is anything while the tier is not suspect.
func TestHeldMarkIsHeldOnce(t *testing.T) {
	admClk := clock.NewFake(time.Now().Add(-time.Hour))
	i := mustNew(t, WithAdmission(admission.Config{Window: time.Second, Clock: admClk}))
	l := i.Admission()
	cc := newCC(t)
	serve := func(md metadata.MD, dep *fakeInvoker) error {
		ctx := metadata.NewIncomingContext(ctxTimeout(t, 5*time.Second), md)
		info := &grpc.UnaryServerInfo{FullMethod: "/svc/Tier"}
		_, err := i.UnaryServer()(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
			return nil, i.UnaryClient()(ctx, "/svc/M", nil, nil, cc, dep.invoke)
		})
		return err
	}
	mark := func(dep *fakeInvoker) []string { return dep.seen[len(dep.seen)-1].md.Get(MetadataHeld) }

	dep := &fakeInvoker{results: []error{nil}}
	if err := serve(metadata.Pairs(MetadataDepth, "1"), dep); err != nil || len(mark(dep)) != 0 {
		t.Fatalf("not suspect: err %v, mark %q; want served, no mark", err, mark(dep))
	}
	for _, p := range suspect(t, l, admClk) {
		p.Release(admission.Measured) // room under the cap: the window does not end
	}
	dep = &fakeInvoker{results: []error{nil}}
	if err := serve(metadata.Pairs(MetadataDepth, "1"), dep); err != nil || len(mark(dep)) != 0 {
		t.Fatalf("suspect, room under the cap, no growth on slower work: err %v, mark %q; want served, no mark", err, mark(dep))
	}
	// Fill the cap: Wait admits until it holds (its caller gone, it
	// returns at once).
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	var in []admission.Permit
	for n := 0; ; n++ {
		p, err := l.Wait(gone, admission.ClassFirst, time.Time{})
		if errors.Is(err, context.Canceled) {
			break
		}
		if err != nil || n == 1000 {
			t.Fatalf("filling the suspect cap: %v after %d", err, n)
		}
		in = append(in, p)
	}
	dep = &fakeInvoker{results: []error{nil}}
	if err := serve(metadata.Pairs(MetadataDepth, "1", MetadataHeld, "1"), dep); err != nil {
		t.Fatalf("a marked request at the full suspect cap: %v, want it admitted at once", err)
	}
	if got := mark(dep); len(got) != 1 || got[0] != "1" {
		t.Errorf("a marked request's call: %s %q, want \"1\" passed on", MetadataHeld, got)
	}
	if !l.Suspect() {
		t.Fatal("no longer suspect: the test tests nothing")
	}
	for _, p := range in {
		p.Release(admission.Measured)
	}
}
