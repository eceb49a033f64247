package interceptor

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"

	"google.golang.org/grpc"
)

// TestMethodRoomLearns: handlers whose stacks move movedToGrow times in
// a row make room first; one that does not move breaks the run; while
// room is made, every probeEvery'th handler runs without it, and
// quietToEnd probes in a row whose stacks did not move end the room.
func TestMethodRoomLearns(t *testing.T) {
	m := &methodRoom{}
	for range movedToGrow - 1 {
		m.after(m.before(), true)
	}
	m.after(m.before(), false) // the run breaks
	for range movedToGrow - 1 {
		m.after(m.before(), true)
	}
	if m.room.Load() {
		t.Fatalf("room after runs of %d moves, want none", movedToGrow-1)
	}
	if made := m.before(); made {
		t.Fatal("room made before the method needs it")
	}
	m.after(false, true)
	if !m.room.Load() {
		t.Fatalf("no room after %d moves in a row", movedToGrow)
	}

	// probes runs a probeEvery cycle of handlers whose stacks do not
	// move with room, checks that the last, the probe, ran without it,
	// and tells the learner whether the probe's stack moved.
	probes := func(probeMoved bool) {
		t.Helper()
		made := 0
		for n := 1; n < probeEvery; n++ {
			if m.before() {
				made++
			}
			m.after(true, false)
		}
		if made != probeEvery-1 {
			t.Fatalf("room made for %d of %d handlers, want all", made, probeEvery-1)
		}
		if m.before() {
			t.Fatal("a probe ran with room made")
		}
		m.after(false, probeMoved)
	}
	probes(false) // quiet
	probes(true)  // moved: the quiet run starts again
	probes(false)
	if !m.room.Load() {
		t.Fatal("room ended by a probe whose stack did not move, after one that did")
	}
	probes(false)
	if m.room.Load() {
		t.Fatalf("room kept after %d quiet probes in a row", quietToEnd)
	}
}

// TestMethodRoomGivesUp: handlers whose stacks move even with room made
// movedToGrow times in a row end the room for good.
func TestMethodRoomGivesUp(t *testing.T) {
	m := &methodRoom{}
	for range movedToGrow {
		m.after(m.before(), true)
	}
	for n := 0; n < movedToGrow-1; n++ {
		made := m.before()
		m.after(made, made) // with room: moved; a probe: not
	}
	if !m.room.Load() || m.helpless.Load() {
		t.Fatal("gave up before the run of moves with room")
	}
	m.after(true, true)
	if m.room.Load() || !m.helpless.Load() {
		t.Fatalf("room kept after %d moves in a row with room made", movedToGrow)
	}
	for range 2 * movedToGrow {
		m.after(m.before(), true)
	}
	if m.room.Load() {
		t.Fatal("room made again for handlers it did not help")
	}
}

// TestStackRoomBounded: a nil learner, or one that knows maxRoomMethods
// methods, makes no room for a new method, and does not panic.
func TestStackRoomBounded(t *testing.T) {
	var none *stackRoom
	if m := none.of("/svc/M"); m != nil || m.before() {
		t.Fatal("a nil learner made room")
	}
	none.of("/svc/M").after(false, true)

	r := &stackRoom{}
	first := r.of("/svc/M0")
	if first == nil || r.of("/svc/M0") != first {
		t.Fatal("a method's state is not kept")
	}
	for i := 1; i < maxRoomMethods; i++ {
		if r.of(fmt.Sprintf("/svc/M%d", i)) == nil {
			t.Fatalf("method %d of %d not learnt", i, maxRoomMethods)
		}
	}
	if r.of("/svc/more") != nil {
		t.Fatalf("learnt a method past %d", maxRoomMethods)
	}
	if r.of("/svc/M0") != first {
		t.Fatal("a known method forgotten when full")
	}
}

// TestMakeRoomLeavesRoom: after makeRoom, a call that takes nearly
// handlerRoom of stack below the caller does not move the stack (it was
// grown, if it had to be, where makeRoom ran); without it, a call a KB
// deeper than a new goroutine's whole stack does.
func TestMakeRoomLeavesRoom(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no shrinking meanwhile
	moved := func(room bool, kb int) bool {
		done := make(chan bool)
		go func() {
			if room {
				makeRoom()
			}
			var v byte
			at := stackMark(&v)
			deep(kb)
			done <- at != stackMark(&v)
		}()
		return <-done
	}
	if moved(true, handlerRoom/1024-1) {
		t.Fatal("the stack moved below makeRoom's caller")
	}
	if !moved(false, startingStackKB(t)+1) {
		t.Fatal("the stack did not move without room: the test shows nothing")
	}
}

// TestHeldRoomOutlastsTheCollector: a handler given room that waits
// before it calls on (a timer, a pool, a lock) while the collector runs.
// Run in held room (inRoom), its stack neither shrinks nor grows: it
// still has the room when it goes deep. Run plainly after makeRoom, the
// collector halves the stack of the waiting goroutine, which uses less
// than a quarter of it, and that moves it.
func TestHeldRoomOutlastsTheCollector(t *testing.T) {
	if kb := startingStackKB(t); kb > 16 {
		t.Fatalf("goroutines start with %d KB of stack: held room keeps a quarter of 16 KB, not of more", kb)
	}
	moved := func(held bool) bool {
		entered, release, done := make(chan struct{}), make(chan struct{}), make(chan bool)
		handler := func(context.Context, any) (any, error) {
			var v byte
			at := stackMark(&v)
			close(entered)
			<-release // the collector runs meanwhile
			deep(handlerRoom/1024 - 1)
			done <- at != stackMark(&v)
			return nil, nil
		}
		go underServerFrames(func() {
			makeRoom()
			if held {
				_, _ = inRoom(context.Background(), nil, handler)
			} else {
				_, _ = handler(context.Background(), nil)
			}
		})
		<-entered
		runtime.GC()
		runtime.GC()
		close(release)
		return <-done
	}
	if moved(true) {
		t.Fatal("the stack moved below held room after the collector ran")
	}
	// The control: a goroutine the collector finds before it waits is
	// not shrunk; one of a few tries is.
	for range 5 {
		if moved(false) {
			return
		}
	}
	t.Fatal("the stack did not move without held room: the test shows nothing")
}

// underServerFrames runs f below a frame of 1 KB, about what grpc-go's
// frames take above the server interceptor.
//
//go:noinline
func underServerFrames(f func()) {
	var b [1016]byte
	keep(&b)
	f()
}

// startingStackKB returns the stack size, in KB, that the runtime starts
// goroutines with now.
func startingStackKB(t *testing.T) int {
	s := []metrics.Sample{{Name: "/gc/stack/starting-size:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Fatalf("%s: not supported", s[0].Name)
	}
	return int(s[0].Value.Uint64() >> 10)
}

// deep takes n KB of stack below its caller, in frames of 1 KB.
//
//go:noinline
func deep(n int) byte {
	var b [1016]byte // with the return address and frame pointer: 1 KB
	keep(&b)
	if n <= 1 {
		return b[0]
	}
	return deep(n-1) + b[1]
}

// TestServerMakesRoomForMovingHandlers: through the server interceptor,
// a method whose handlers' stacks move (they go deeper than a new
// goroutine's stack) gets room made first, in which a handler that goes
// nearly handlerRoom deep no longer moves; probes that do not move (the
// handlers stopped going deep) end the room; handlers that stay shallow
// never get any, and handlers that go deeper than any room are given up
// on.
func TestServerMakesRoomForMovingHandlers(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no shrinking meanwhile
	i, err := New(Recommended()...)
	if err != nil {
		t.Fatal(err)
	}
	srv := i.UnaryServer()
	// run serves one request of method whose handler goes kb deep, on a
	// new goroutine as grpc-go's, and reports whether its stack moved.
	run := func(method string, kb int) bool {
		done := make(chan bool)
		go func() {
			moved := false
			_, err := srv(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) {
				var v byte
				at := stackMark(&v)
				if kb > 0 {
					deep(kb)
				}
				moved = at != stackMark(&v)
				return nil, nil
			})
			if err != nil {
				t.Error(err)
			}
			done <- moved
		}()
		return <-done
	}
	room := i.server.room
	for range movedToGrow {
		if !run("/svc/Deep", startingStackKB(t)+1) {
			t.Fatal("a handler deeper than a new goroutine's stack did not move")
		}
		run("/svc/Shallow", 0)
	}
	if !room.of("/svc/Deep").room.Load() {
		t.Fatalf("no room after %d handlers that moved", movedToGrow)
	}
	for n := range probeEvery - 1 { // before the first probe
		if run("/svc/Deep", handlerRoom/1024-2) {
			t.Fatalf("handler %d moved with room made", n)
		}
	}
	for range 2 * probeEvery { // the method's handlers no longer go deep
		run("/svc/Deep", 0)
	}
	if room.of("/svc/Deep").room.Load() {
		t.Fatalf("room kept after %d probes that did not move", quietToEnd)
	}
	if room.of("/svc/Shallow").room.Load() {
		t.Fatal("room made for handlers that stay shallow")
	}

	for range 2 * movedToGrow {
		run("/svc/Deeper", 64) // deeper than any room
	}
	if m := room.of("/svc/Deeper"); m.room.Load() || !m.helpless.Load() {
		t.Fatalf("room %v, given up %v for handlers deeper than any room; want none, yes", m.room.Load(), m.helpless.Load())
	}
}

// TestStackRoomConcurrent: many handlers of one method at once, some
// going deep, some panicking, through the server interceptor: no race
// (go test -race), no panic of the learner's, and every request ends.
func TestStackRoomConcurrent(t *testing.T) {
	i, err := New() // no admission control to refuse any of them
	if err != nil {
		t.Fatal(err)
	}
	srv := i.UnaryServer()
	kb := startingStackKB(t) + 1
	done := make(chan bool)
	const n = 200
	for k := range n {
		go func() {
			defer func() { done <- recover() != nil }()
			_, _ = srv(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/svc/M"}, func(context.Context, any) (any, error) {
				if k%10 == 9 {
					panic("handler")
				}
				if k%2 == 0 {
					deep(kb)
				}
				return nil, nil
			})
		}()
	}
	panics := 0
	for range n {
		if <-done {
			panics++
		}
	}
	if panics != n/10 {
		t.Fatalf("%d handlers panicked through the interceptor, want %d", panics, n/10)
	}
}
