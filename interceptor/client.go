package interceptor

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// UnaryClientInterceptor returns the retrying client interceptor for
// unary calls. Use it with grpc.WithDisableRetry (DialOptions does both):
// with grpc.WithChainUnaryInterceptor alone, a service config retry
// policy stays on underneath and multiplies its attempts unseen (3 x 3 = 9
// calls where 3 were meant; see Interceptors.UnaryClient).
//
// As gRFC A6 prescribes, an attempt whose response headers arrived
// commits the call: it is not retried, whatever status follows (the
// server may have acted on the request). A failure before any header (a
// trailers-only response) is retried.
//
// What the breaker and the budget count: an attempt that ends with
// UNAVAILABLE, or with DEADLINE_EXCEEDED of its own per-attempt timeout,
// is a failure; so is one still running when the caller's deadline
// expires, since a hang is the most expensive failure a target has; and
// for the budget, one with any code the call retries (WithCodes).
// RESOURCE_EXHAUSTED says nothing about the target (a quota, not
// overload). An attempt whose caller cancels it counts for nothing. A
// call cancelled while it waits to retry ends with codes.Canceled (or
// DeadlineExceeded), and errors.Is matches context.Canceled (or
// context.DeadlineExceeded), as with grpc-go's own retry.
//
// Invalid options cannot be reported from here; the interceptor then fails
// every call with codes.Internal and the reason. Use New to get the error
// at start-up instead.
func UnaryClientInterceptor(opts ...Option) grpc.UnaryClientInterceptor {
	i, err := New(opts...)
	if err != nil {
		return func(context.Context, string, any, any, *grpc.ClientConn, grpc.UnaryInvoker, ...grpc.CallOption) error {
			return status.Error(codes.Internal, err.Error())
		}
	}
	return i.UnaryClient()
}

// client holds the configuration of one client interceptor.
type client struct {
	cfg config
	// last is the normalized target of the last connection seen: one
	// interceptor usually serves one connection, whose target does not
	// change, so the key is computed once, not on every call.
	last atomic.Pointer[connTarget]
}

type connTarget struct {
	cc     *grpc.ClientConn
	target string // normalized
}

// target returns the normalized target of cc (see normalizeTarget).
func (cl *client) target(cc *grpc.ClientConn) string {
	if t := cl.last.Load(); t != nil && t.cc == cc {
		return t.target
	}
	t := &connTarget{cc: cc, target: normalizeTarget(cc.Target())}
	cl.last.Store(t)
	return t.target
}

// callConfig returns the configuration for one call: the interceptor's,
// or a copy with the call's own Options applied (see config.forCall).
func (cl *client) callConfig(opts []grpc.CallOption) (*config, error) {
	return cl.cfg.forCall(opts)
}

// DialOptions is New(opts...).DialOptions(), with invalid options failing
// every call instead of returning an error.
func DialOptions(opts ...Option) []grpc.DialOption {
	i, err := New(opts...)
	if err != nil {
		return []grpc.DialOption{
			grpc.WithDisableRetry(),
			grpc.WithChainUnaryInterceptor(UnaryClientInterceptor(opts...)),
			grpc.WithChainStreamInterceptor(StreamClientInterceptor(opts...)),
		}
	}
	return i.DialOptions()
}
