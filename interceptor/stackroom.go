package interceptor

import (
	"sync"
	"sync/atomic"
	"unsafe"
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
// function with a frame of handlerRoom bytes, which makes the runtime
// double the stack there, once, with room for the rest. On the same
// harness (four alternating runs against the interceptor without it):
// 4-15 % more requests answered within their 60 ms deadline, 4-15 %
// less CPU per answer. A method whose handlers do not go that deep (a
// leaf tier, a handler that calls the next tier from goroutines of its
// own) is not seen to move, and pays a lookup of its method and two
// calls of stackMark per request. Streams are left alone: a stream's
// goroutine grows once for all its messages.
const (
	// handlerRoom is what a handler's call to the next tier takes below
	// the server interceptor: grpc-go's client path, the client
	// interceptor, and a few frames of the handler's own.
	handlerRoom = 6 << 10
	// movedToGrow handlers in a row whose stack moved make a method's
	// handlers get room first. A stack also moves when the garbage
	// collector shrinks a waiting handler's, now and then: not in a row.
	movedToGrow = 16
	// probeEvery'th handler of a method that gets room first runs
	// without, to see whether its stack still moves; one that does not
	// ends the room, until handlers are seen to move again.
	probeEvery = 128
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
	room  atomic.Bool   // make room before each handler (but probes)
	moved atomic.Int32  // handlers in a row whose stack moved, while not
	count atomic.Uint32 // handlers while room is made, for the probes
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
	case m == nil || made:
	case m.room.Load(): // a probe
		if !moved {
			m.room.Store(false)
		}
	case !moved:
		if m.moved.Load() != 0 {
			m.moved.Store(0)
		}
	case m.moved.Add(1) >= movedToGrow:
		m.moved.Store(0)
		m.room.Store(true)
	}
}

// makeRoom has a frame of handlerRoom bytes: called where the stack
// lacks that much room, it makes the runtime grow the stack (to twice
// its size, or more if that is not enough).
//
//go:noinline
func makeRoom() {
	var room [handlerRoom]byte
	keepRoom(&room)
}

// keepRoom keeps makeRoom's frame: a frame whose array is never used is
// dropped by the compiler.
//
//go:noinline
func keepRoom(*[handlerRoom]byte) {}

// stackMark returns the address of a local in its own frame: called
// twice from the same frame, the two differ only if the goroutine's
// stack moved in between (it grew, or the collector shrank it).
//
//go:noinline
func stackMark() uintptr {
	var b byte
	return uintptr(unsafe.Pointer(&b))
}
