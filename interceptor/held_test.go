package interceptor

import (
	"context"
	"errors"
	"sync"
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

// parkedCtx is a context that closes parked the first time its Done is
// called: Limiter.Wait calls it, without a deadline to wait for, only
// once the request waits in the suspect phase's queue (or, held by an
// overload's probe, for its refusal: not here).
type parkedCtx struct {
	context.Context
	once   sync.Once
	parked chan struct{}
}

func (c *parkedCtx) Done() <-chan struct{} {
	c.once.Do(func() { close(c.parked) })
	return c.Context.Done()
}

// A tier whose own admission control grew its suspect cap because its
// work became slower rather than queued marks the calls its handler
// makes for a request it then admits: the tiers below wait on the same
// slow work, and this tier's cap bounds what it sends them (protocol
// section 2.7). The situation, on a fake clock with windows of 1 s:
// fast requests (10 ms, 20 a second: the base), then slow ones that
// hold the 4 slots of the cap the server took when it became suspect;
// in the next window one request admitted under that cap is served in
// 15 ms (within twice the base, not within it), one in 800 ms, and two
// requests wait. At that window's end the cap is full and holds
// requests back, the time per completion (85 ms) is above four times
// the base, and what the arrivals need at the phase's latency (twice
// 13 a second times 408 ms: 10) exceeds the cap: it grows on the
// work's evidence, to 8 (slowerWork in admission/suspect.go). A permit
// that Wait gives right then reports Held, and a request served through
// the server interceptor then calls below with x-stormguard-held: 1,
// though its caller sent no mark. (TestHeldMarkIsHeldOnce has the cases
// that are not marked; admission's TestHeldOnlyWhereTheWorkBecameSlower,
// where the mark comes from.)
func TestHeldPermitMarksTheCallsBelow(t *testing.T) {
	admClk := clock.NewFake(time.Now().Add(-time.Hour))
	i := mustNew(t, WithAdmission(admission.Config{Window: time.Second, Clock: admClk}))
	l := i.Admission()
	cc := newCC(t)
	acquire := func() admission.Permit {
		t.Helper()
		p, err := l.Acquire(admission.ClassFirst, time.Time{})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		return p
	}
	wait := func() admission.Permit {
		t.Helper()
		p, err := l.Wait(ctxTimeout(t, 10*time.Second), admission.ClassFirst, time.Time{})
		if err != nil || p.Held() {
			t.Fatalf("Wait with a slot free under the cap: held %v, err %v; want admitted, not marked", p.Held(), err)
		}
		return p
	}
	serve := func(d time.Duration) {
		p := acquire()
		admClk.Advance(d)
		p.Release(admission.Measured)
	}
	// A Wait whose caller is gone returns at once if the cap holds it.
	gone, cancel := context.WithCancel(context.Background())
	cancel()

	// Three windows of fast requests: 10 ms, one every 50 ms.
	for range 60 {
		serve(10 * time.Millisecond)
		admClk.Advance(40 * time.Millisecond)
	}
	if base := l.Stats().Base; base != 10*time.Millisecond || l.Suspect() {
		t.Fatalf("after the fast requests: base %v, suspect %v; want 10ms, not suspect", base, l.Suspect())
	}
	// Slow requests take 4 slots (Acquire, which holds no one), and 4
	// fast ones are served in the window; the last ends it: arrivals
	// exceed completions, and the cap is the 4 in flight.
	var in []admission.Permit
	for range 4 {
		in = append(in, acquire())
	}
	for range 4 {
		admClk.Advance(240 * time.Millisecond)
		serve(10 * time.Millisecond)
	}
	if !l.Suspect() || l.InFlight() != 4 {
		t.Fatalf("4 slow requests in flight: suspect %v, in flight %d; want suspect with 4", l.Suspect(), l.InFlight())
	}
	// A slow request ends; in its slot a fast one is served in 15 ms,
	// then a slow one in 800 ms, and another takes the slot.
	in[0].Release(admission.Measured)
	in = in[1:]
	fast := wait()
	admClk.Advance(15 * time.Millisecond)
	fast.Release(admission.Measured)
	slow := wait()
	admClk.Advance(800 * time.Millisecond)
	slow.Release(admission.Measured)
	in = append(in, wait())

	// Two requests wait behind the full cap, and the cap holds a third
	// (gone, its Wait returns).
	waitCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	waited, waiting := make(chan error, 2), 0
	defer func() {
		stop()
		for range waiting {
			<-waited
		}
	}()
	for range 2 {
		ctx := &parkedCtx{Context: waitCtx, parked: make(chan struct{})}
		waiting++
		go func() {
			p, err := l.Wait(ctx, admission.ClassFirst, time.Time{})
			p.Release(admission.Ignored)
			waited <- err
		}()
		select {
		case <-ctx.parked:
		case err := <-waited:
			waiting--
			t.Fatalf("a Wait at the full suspect cap ended (%v), want it held", err)
		}
	}
	if p, err := l.Wait(gone, admission.ClassFirst, time.Time{}); !errors.Is(err, context.Canceled) {
		p.Release(admission.Ignored)
		t.Fatalf("Wait at the full suspect cap before the window ends: err %v; want it held (context.Canceled)", err)
	}

	// The window ends at the next arrival: the cap grows on the work's
	// evidence, and what it admits is Held.
	admClk.Advance(185 * time.Millisecond)
	p, err := l.Wait(gone, admission.ClassFirst, time.Time{})
	if err != nil || !p.Held() {
		t.Fatalf("Wait as the window ends: held %v, err %v; want admitted under the grown cap, held", p.Held(), err)
	}
	defer p.Release(admission.Measured)
	if !l.Suspect() {
		t.Fatal("no longer suspect: the test tests nothing")
	}

	dep := &fakeInvoker{results: []error{nil}}
	ctx := metadata.NewIncomingContext(ctxTimeout(t, 5*time.Second), metadata.Pairs(MetadataDepth, "1"))
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/Tier"}
	_, err = i.UnaryServer()(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
		return nil, i.UnaryClient()(ctx, "/svc/M", nil, nil, cc, dep.invoke)
	})
	if err != nil || len(dep.seen) != 1 {
		t.Fatalf("a request under the grown suspect cap: err %v, %d calls below; want served, one call", err, len(dep.seen))
	}
	if got := dep.seen[0].md.Get(MetadataHeld); len(got) != 1 || got[0] != "1" {
		t.Errorf("the call below of a request this tier admitted Held: %s %q, want \"1\"", MetadataHeld, got)
	}
	for _, p := range in {
		p.Release(admission.Measured)
	}
}
