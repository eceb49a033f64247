package interceptor

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/admission"
)

// UnaryServerInterceptor returns the server interceptor for unary calls.
// It parses the attempt metadata of each request into the handler's
// context (see FromContext), where the client interceptor finds it when
// the handler calls the next tier; and when such a call gave up on a
// retryable failure, it answers the caller with the trailer
// grpc-retry-pushback-ms: -1, so that the tier above does not retry.
//
// Invalid options make every call fail with codes.Internal; use New to get
// the error at start-up.
func UnaryServerInterceptor(opts ...Option) grpc.UnaryServerInterceptor {
	i, err := New(opts...)
	if err != nil {
		return func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return i.UnaryServer()
}

type server struct {
	untrusted bool
	observer  Observer
	retryable uint64 // codes answered with "do not retry"; see WithCodes

	ignoreEnvoy bool // WithEnvoyAttemptCount(false)
	admission   *admission.Limiter
	health      *selfHealth    // WithHealth
	rand        func() float64 // the jitter of admission's pushback
}

// dontRetry is the trailer that tells the caller not to retry.
var dontRetry = metadata.Pairs(MetadataPushback, "-1")

// begin returns the handler's context, carrying the request's Info
// (parsed when first needed: see serverState).
func (s *server) begin(ctx context.Context, method string) *stateCtx {
	sc := &stateCtx{Context: ctx}
	sc.st.srv, sc.st.in, sc.st.method = s, ctx, method
	if s.health != nil {
		sc.st.epoch = s.health.serving.Epoch()
	}
	if s.observer != nil {
		s.observer.Observe(ctx, Event{Kind: EventRequestReceived, Method: method, Info: sc.st.Info()})
	}
	return sc
}

// parseInfo reads the Info of the request ctx serves for method from its
// metadata, and reports a stacked retry (see stackedRetry); the zero Info
// with WithUntrustedCallers.
func (s *server) parseInfo(ctx context.Context, method string) Info {
	if s.untrusted {
		return Info{}
	}
	in, stacked := incomingInfo(ctx)
	if stacked {
		s.stackedRetry(ctx, method, in)
	}
	return s.envoyRetries(ctx, in)
}

// dontRetryNeeded reports whether the handler's error must carry the
// "do not retry" trailer: it has a retryable code, and one of the
// handler's calls gave up on a retryable failure.
func (s *server) dontRetryNeeded(sc *stateCtx, method string, err error) bool {
	if err == nil || s.retryable&codeBit(status.Code(err)) == 0 || !sc.st.gaveUp.Load() {
		return false
	}
	if s.observer != nil {
		s.observer.Observe(sc, Event{Kind: EventPushbackSent, Method: method, Code: status.Code(err), Info: sc.st.Info()})
	}
	return true
}

func (s *server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	if healthMethod(info.FullMethod) {
		return handler(ctx, req)
	}
	sc := s.begin(ctx, info.FullMethod)
	a, err := s.admit(sc, info.FullMethod, nil)
	if err != nil {
		return nil, err
	}
	returned := false
	defer func() {
		if !returned && s.dontRetryOnPanic(sc, info.FullMethod) {
			_ = grpc.SetTrailer(sc, dontRetry)
		}
	}()
	defer func() { a.done(err) }()
	resp, err = handler(sc, req)
	returned = true
	s.health.record(sc, err, s.retryable)
	if s.dontRetryNeeded(sc, info.FullMethod, err) {
		_ = grpc.SetTrailer(sc, dontRetry)
	}
	return resp, err
}

// dontRetryOnPanic reports whether a handler that panics must still send
// the "do not retry" trailer: one of its calls gave up. The interceptors
// set it from a deferred function and let the panic go on. A recovery
// interceptor further out may turn the panic into a retryable code; without the trailer the tier above would retry a
// request this tier already retried. The code is unknown here, so the
// trailer goes out whatever it will be (a caller ignores it on a code it
// does not retry anyway).
func (s *server) dontRetryOnPanic(sc *stateCtx, method string) bool {
	if !sc.st.gaveUp.Load() {
		return false
	}
	if s.observer != nil {
		s.observer.Observe(sc, Event{Kind: EventPushbackSent, Method: method, Code: codes.Unknown, Info: sc.st.Info()})
	}
	return true
}

// StreamServerInterceptor returns the server interceptor for streams: the
// same as UnaryServerInterceptor, for streaming handlers.
//
// Invalid options make every stream fail with codes.Internal; use New to
// get the error at start-up.
func StreamServerInterceptor(opts ...Option) grpc.StreamServerInterceptor {
	i, err := New(opts...)
	if err != nil {
		return func(any, grpc.ServerStream, *grpc.StreamServerInfo, grpc.StreamHandler) error {
			return status.Error(codes.Internal, err.Error())
		}
	}
	return i.StreamServer()
}

// serverStream gives a streaming handler the context with its Info.
type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }

func (s *server) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if healthMethod(info.FullMethod) {
		return handler(srv, ss)
	}
	sc := s.begin(ss.Context(), info.FullMethod)
	a, err := s.admit(sc, info.FullMethod, ss)
	if err != nil {
		return err
	}
	a.started() // a stream's start only takes a slot: see admitted.started
	returned := false
	defer func() {
		if !returned && s.dontRetryOnPanic(sc, info.FullMethod) {
			ss.SetTrailer(dontRetry)
		}
	}()
	err = handler(srv, &serverStream{ServerStream: ss, ctx: sc})
	returned = true
	s.health.record(sc, err, s.retryable)
	if s.dontRetryNeeded(sc, info.FullMethod, err) {
		ss.SetTrailer(dontRetry)
	}
	return err
}

// ServerOptions returns the server options that install the server
// interceptors. Invalid options make every call fail; use New to get the
// error at start-up.
func ServerOptions(opts ...Option) []grpc.ServerOption {
	i, err := New(opts...)
	if err != nil {
		return []grpc.ServerOption{
			grpc.ChainUnaryInterceptor(UnaryServerInterceptor(opts...)),
			grpc.ChainStreamInterceptor(StreamServerInterceptor(opts...)),
		}
	}
	return i.ServerOptions()
}
