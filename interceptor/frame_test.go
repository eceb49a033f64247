package interceptor

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc"
)

// The unary interceptors' stack frames sit under every handler that
// calls on, on a goroutine grpc-go starts per request: frames that push
// that goroutine's deepest point past its stack's size make the runtime
// copy the whole stack on every request (13 % more CPU per request on
// the silent check's chain for 512 bytes of locals on each side;
// BENCHMARKS.md, "What a call costs"). These tests measure the stack
// that Recommended's interceptors hold while the invoker and the handler
// run, against pass-through interceptors, and hold it to a bound: work
// that needs more room belongs in a call made before or after, whose
// frame is gone meanwhile. (Before a61684f the client held 480 bytes
// more than a pass-through one, 728 under the race detector, and the
// server 232 and 336; now 192 and 168, 256 and 256.)

// sp returns an address in its caller's frame's neighbourhood: the
// difference of two calls, one from further down, is the stack between.
//
//go:noinline
func sp() uintptr {
	var x byte
	return uintptr(unsafe.Pointer(&x))
}

//go:noinline
func growStack(n int) byte {
	var pad [32 << 10]byte
	pad[n%len(pad)] = byte(n)
	return pad[(n+1)%len(pad)]
}

// stackBelow runs call on a goroutine whose stack is already large (so
// that it is not moved meanwhile) and returns how far below call's caller
// the function that call reaches runs, as reach reports it.
func stackBelow(t *testing.T, call func(reach func())) uintptr {
	t.Helper()
	done := make(chan uintptr, 1)
	go func() {
		growStack(1)
		var inner uintptr
		outer := sp()
		call(func() { inner = sp() })
		done <- outer - inner
	}()
	select {
	case d := <-done:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not return")
		return 0
	}
}

// leastBelow is stackBelow's least of a few runs (a GC that shrinks the
// stack between the two reads can only make one run read more).
func leastBelow(t *testing.T, call func(reach func())) uintptr {
	least := stackBelow(t, call)
	for range 4 {
		least = min(least, stackBelow(t, call))
	}
	return least
}

func TestUnaryClientFrameStaysSmall(t *testing.T) {
	i := mustNew(t, Recommended()...)
	cc := newCC(t)
	client := func(ic grpc.UnaryClientInterceptor) uintptr {
		return leastBelow(t, func(reach func()) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
				reach()
				return nil
			}
			if err := ic(ctx, "/svc/M", nil, nil, cc, invoker); err != nil {
				t.Error(err)
			}
		})
	}
	holdsAtMost(t, "client interceptor", "invoker", client(i.UnaryClient()), client(noopUnaryClient), 256, 352)
}

func TestUnaryServerFrameStaysSmall(t *testing.T) {
	i := mustNew(t, Recommended()...)
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/M"}
	server := func(is grpc.UnaryServerInterceptor) uintptr {
		return leastBelow(t, func(reach func()) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			handler := func(context.Context, any) (any, error) {
				reach()
				return nil, nil
			}
			if _, err := is(ctx, nil, info, handler); err != nil {
				t.Error(err)
			}
		})
	}
	holdsAtMost(t, "server interceptor", "handler", server(i.UnaryServer()), server(noopUnaryServer), 200, 304)
}

// holdsAtMost checks that ours, the stack an interceptor holds above
// below, is at most most bytes more than pass, a pass-through one's
// (raceMost under the race detector).
func holdsAtMost(t *testing.T, what, below string, ours, pass, most, raceMost uintptr) {
	t.Helper()
	if raceBuild {
		most = raceMost
	}
	t.Logf("%s: %d bytes of stack above the %s, pass-through %d", what, ours, below, pass)
	if ours > pass+most {
		t.Errorf("the %s holds %d bytes of stack above the %s, %d more than a pass-through one; want at most %d more", what, ours, below, ours-pass, most)
	}
}
