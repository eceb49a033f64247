package interceptor

import (
	"context"
	"fmt"
	"runtime/debug"
	"runtime/metrics"
	"testing"

	"google.golang.org/grpc"
)

// TestMethodRoomLearns: handlers whose stacks move movedToGrow times in
// a row make room first; one that does not move breaks the run; while
// room is made, every probeEvery'th handler runs without it, and a probe
// whose stack did not move ends the room.
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

	made := 0
	for n := 1; n < probeEvery; n++ {
		if m.before() {
			made++
		}
		m.after(true, false) // with room: nothing learnt, whatever the stack did
	}
	if made != probeEvery-1 || !m.room.Load() {
		t.Fatalf("room made for %d of %d handlers (room %v), want all", made, probeEvery-1, m.room.Load())
	}
	if m.before() { // the probeEvery'th
		t.Fatal("a probe ran with room made")
	}
	m.after(false, true) // the probe's stack moved: room stays
	if !m.room.Load() {
		t.Fatal("room ended by a probe whose stack moved")
	}
	for n := 1; n < probeEvery; n++ {
		m.after(m.before(), false)
	}
	if m.before() {
		t.Fatal("the second probe ran with room made")
	}
	m.after(false, false)
	if m.room.Load() {
		t.Fatal("room kept after a probe whose stack did not move")
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
			at := stackMark()
			deep(kb)
			done <- at != stackMark()
		}()
		return <-done
	}
	if moved(true, handlerRoom/1024) {
		t.Fatal("the stack moved below makeRoom's caller")
	}
	if !moved(false, startingStackKB(t)+1) {
		t.Fatal("the stack did not move without room: the test shows nothing")
	}
}

// startingStackKB returns the stack size, in KB, that the runtime starts
// goroutines with now; at most 8 for the tests that use it (a test
// binary's goroutines start with 2 or 4).
func startingStackKB(t *testing.T) int {
	s := []metrics.Sample{{Name: "/gc/stack/starting-size:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Fatalf("%s: not supported", s[0].Name)
	}
	kb := int(s[0].Value.Uint64() >> 10)
	if kb > 8 {
		t.Fatalf("goroutines start with %d KB of stack: a handler's room would not grow it", kb)
	}
	return kb
}

// deep takes n-1 KB of stack below its caller, in frames of 1 KB.
//
//go:noinline
func deep(n int) byte {
	var b [1000]byte
	keepFrame(&b)
	if n <= 1 {
		return b[0]
	}
	return deep(n-1) + b[1]
}

//go:noinline
func keepFrame(*[1000]byte) {}

// TestServerMakesRoomForMovingHandlers: through the server interceptor,
// a method whose handlers' stacks move (here they go deep) gets room
// made first, and then they no longer move; a method whose handlers stay
// shallow never does.
func TestServerMakesRoomForMovingHandlers(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	i, err := New(Recommended()...)
	if err != nil {
		t.Fatal(err)
	}
	srv := i.UnaryServer()
	run := func(method string, handler grpc.UnaryHandler) {
		done := make(chan struct{})
		go func() { // a new goroutine per request, as grpc-go's
			defer close(done)
			if _, err := srv(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: method}, handler); err != nil {
				t.Error(err)
			}
		}()
		<-done
	}
	// Deeper than a new goroutine's stack, within the 16 KB that room
	// made on one of at most 8 KB leaves (see startingStackKB).
	kb := startingStackKB(t) + 1
	var movedAfter int
	for n := range movedToGrow + 10 {
		run("/svc/Deep", func(context.Context, any) (any, error) {
			at := stackMark()
			deep(kb)
			if at != stackMark() && n >= movedToGrow {
				movedAfter++
			}
			return nil, nil
		})
		run("/svc/Shallow", func(context.Context, any) (any, error) { return nil, nil })
	}
	room := i.server.room
	if deepRoom := room.of("/svc/Deep"); !deepRoom.room.Load() || movedAfter != 0 {
		t.Fatalf("deep handlers: room %v, %d moved with it; want room and none", deepRoom.room.Load(), movedAfter)
	}
	if room.of("/svc/Shallow").room.Load() {
		t.Fatal("room made for handlers that stay shallow")
	}
}
