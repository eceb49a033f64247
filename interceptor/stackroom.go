package interceptor

import (
	"context"
	"sync"
	"sync/atomic"
	"unsafe"

	"google.golang.org/grpc"
)

// Room on the stack for a handler's calls to the next tier.
//
// grpc-go runs each unary request's handler on a goroutine of its own,
// which starts with the stack size the runtime starts goroutines with
// (from the process's average use: 8 KB on the busy harness's middle
// tiers). A handler that calls the next tier reaches its deepest point
// in grpc-go's client, some 4.7 KB below the client interceptor in
// grpc-go 1.85 (NewStream, createHeaderFields). When that point lies
// past the end of the stack, the runtime doubles the stack there: it
// copies it and adjusts every frame on it, some 35 frames down, on every
// request. On the busy harness (order over TCP, 512 callers, a payment
// that waits 20 ms) that took 9 µs per request, about half of what
// Recommended added to order's CPU per request; the frames of any
// interceptor push a shallow handler past that line.
//
// The same doubling costs much less where a dozen frames are on the
// stack. So for a method whose handlers' stacks are seen to move, the
// server interceptor makes room before the handler runs: it calls a
// function with a frame of heldRoom + handlerRoom bytes, which makes the
// runtime double the stack there, once, with room for the rest; and it
// runs the handler below a frame of heldRoom bytes, so that the
// collector does not take the room back while the handler waits (see
// inRoom). On the same harness (six pairs of alternating runs against
// the interceptor without it): 1-15 % more requests answered within
// their 60 ms deadline, more in every pair.
//
// What it costs: every unary request, a lookup of its method before and
// after the handler; while a method's handlers get room, an atomic count
// per request (for the probes) and the growth itself, which a handler
// that would not have gone deep pays for nothing; and memory, a stack
// twice its starting size for each such handler while it runs (on the
// busy harness under 512 callers, order's and gateway's goroutine stacks
// took about 10 MB against 5 MB with no interceptor). A method whose
// handlers do not go that deep (a leaf tier, a handler that calls the
// next tier from goroutines of its own) is not seen to move and gets no
// room; nor one whose handlers' stacks move even with room made (they go
// deeper than handlerRoom), which the interceptor gives up on. Streams
// are left alone: a stream's goroutine grows once for all its messages.
const (
	// handlerRoom is what a handler's call to the next tier takes below
	// the server interceptor: grpc-go's client path, the client
	// interceptor, and a few frames of the handler's own.
	handlerRoom = 6 << 10
	// heldRoom is held on the stack while a handler given room runs
	// (see inRoom): with the frames above the server interceptor, more
	// than a quarter of a stack doubled from 8 KB.
	heldRoom = 3 << 10
	// movedToGrow handlers in a row whose stack moved make a method's
	// handlers get room first; as many in a row that moved with room
	// made make the interceptor give up on the method. A stack also
	// moves when the collector shrinks it, which it does (halving it, at
	// most once a cycle) to the stack of a goroutine that uses less than
	// a quarter of it: not to a handler waiting in grpc-go's client,
	// which uses most of its stack, nor to one given room, which waits
	// anywhere below the held frame.
	movedToGrow = 16
	// probeEvery'th handler of a method that gets room first runs
	// without, to see whether its stack still moves; quietToEnd probes in
	// a row whose stack did not move end the room, until handlers are
	// seen to move again. (One would end it at the first handler that
	// happened not to go deep.)
	probeEvery = 128
	quietToEnd = 2
	// maxRoomMethods bounds the methods learnt (a server's registered
	// unary methods; only those reach the interceptor).
	maxRoomMethods = 1024
)

// stackRoom learns, per method, whether handlers need room first.
type stackRoom struct {
	methods sync.Map // method name -> *methodRoom
	n       atomic.Int32
}

// methodRoom is what stackRoom learnt of one method.
type methodRoom struct {
	room     atomic.Bool   // make room before each handler (but probes)
	helpless atomic.Bool   // room made did not keep the stacks from moving: never again
	moved    atomic.Int32  // handlers in a row whose stack moved, without room
	wasted   atomic.Int32  // handlers in a row whose stack moved with room made
	quiet    atomic.Int32  // probes in a row whose stack did not move
	count    atomic.Uint32 // handlers while room is made, for the probes
}

// of returns what was learnt of method, or nil (no room is made) once
// maxRoomMethods are known, or for a nil r.
func (r *stackRoom) of(method string) *methodRoom {
	if r == nil {
		return nil
	}
	if m, ok := r.methods.Load(method); ok {
		return m.(*methodRoom)
	}
	if r.n.Add(1) > maxRoomMethods {
		r.n.Add(-1)
		return nil
	}
	m, loaded := r.methods.LoadOrStore(method, &methodRoom{})
	if loaded {
		r.n.Add(-1)
	}
	return m.(*methodRoom)
}

// before makes room for the handler about to run if its method needs
// it, and reports whether it did.
func (m *methodRoom) before() bool {
	if m == nil || !m.room.Load() || m.count.Add(1)%probeEvery == 0 {
		return false
	}
	makeRoom()
	return true
}

// after learns from a handler that ran with room made first (made) or
// not, and whose stack moved or not.
func (m *methodRoom) after(made, moved bool) {
	switch {
	case m == nil:
	case made:
		if !moved {
			reset(&m.wasted)
		} else if m.wasted.Add(1) >= movedToGrow {
			m.helpless.Store(true)
			m.room.Store(false)
		}
	case m.room.Load(): // a probe
		if moved {
			reset(&m.quiet)
		} else if m.quiet.Add(1) >= quietToEnd {
			reset(&m.quiet)
			m.room.Store(false)
		}
	case !moved:
		reset(&m.moved)
	case m.helpless.Load():
	case m.moved.Add(1) >= movedToGrow:
		reset(&m.moved)
		m.room.Store(true)
	}
}

// reset sets n to zero, without a write when it is zero already (most
// handlers of most methods: no cache line bounces between cores).
func reset(n *atomic.Int32) {
	if n.Load() != 0 {
		n.Store(0)
	}
}

// makeRoom has a frame of heldRoom + handlerRoom bytes: called where the
// stack lacks that much room, it makes the runtime grow the stack (to twice
// its size, or more if that is not enough). The frame is never written:
// the array is declared where no call goes (a frame holds every local of
// its function, and the compiler cannot tell that keepRoomFrame stays
// false), so that its 9 KB are not cleared on every call.
//
//go:noinline
func makeRoom() {
	if keepRoomFrame {
		var room [heldRoom + handlerRoom]byte
		keep(&room)
	}
}

// inRoom runs the handler below a frame of heldRoom bytes, never
// written either (see makeRoom). Room made is room lost if the collector
// shrinks the stack while the handler waits (for a timer, a lock, a
// pool) before it calls on: it halves the stack of a waiting goroutine
// that uses less than a quarter of it, and the call then grows it again
// where it is deepest, the copy room was made to spare. The held frame,
// with the frames above it, keeps more than a quarter of a stack
// doubled from 8 KB in use while the handler runs, so the collector
// leaves it alone. (Above 6 KB or so of frames over it, makeRoom doubles
// the stack to 32 KB, of which the held frame and those frames are more
// than a quarter as well.)
//
//go:noinline
func inRoom(ctx context.Context, req any, handler grpc.UnaryHandler) (any, error) {
	if keepRoomFrame {
		var room [heldRoom]byte
		keep(&room)
	}
	return handler(ctx, req)
}

// keepRoomFrame is never set: see makeRoom.
var keepRoomFrame bool

// keep takes the address of a frame's array, so that the compiler keeps
// the array in the frame.
//
//go:noinline
func keep[T any](*T) {}

// stackMark returns the address of v, a local variable of its caller:
// taken twice in one call, the two differ only if the goroutine's stack
// moved in between (it grew, or the collector shrank it). The address is
// only compared, never used.
func stackMark[T any](v *T) uintptr {
	return uintptr(unsafe.Pointer(v))
}
