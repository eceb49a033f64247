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
	admission *admission.Limiter
}

// dontRetry is the trailer that tells the caller not to retry.
var dontRetry = metadata.Pairs(MetadataPushback, "-1")

// begin returns the handler's context, carrying the request's Info.
func (s *server) begin(ctx context.Context, method string) *stateCtx {
	sc := &stateCtx{Context: ctx}
	if !s.untrusted {
		sc.st.info = incomingInfo(ctx)
	}
	if s.observer != nil {
		s.observer.Observe(ctx, Event{Kind: EventRequestReceived, Method: method, Info: sc.st.info})
	}
	return sc
}

// dontRetryNeeded reports whether the handler's error must carry the
// "do not retry" trailer: it has a retryable code, and one of the
// handler's calls gave up on a retryable failure.
func (s *server) dontRetryNeeded(sc *stateCtx, method string, err error) bool {
	if err == nil || s.retryable&codeBit(status.Code(err)) == 0 || !sc.st.gaveUp.Load() {
		return false
	}
	if s.observer != nil {
		s.observer.Observe(sc, Event{Kind: EventPushbackSent, Method: method, Code: status.Code(err), Info: sc.st.info})
	}
	return true
}

func (s *server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	sc := s.begin(ctx, info.FullMethod)
	a, err := s.admit(sc, info.FullMethod, nil)
	if err != nil {
		return nil, err
	}
	defer a.done(false)
	resp, err := handler(sc, req)
	if s.dontRetryNeeded(sc, info.FullMethod, err) {
		_ = grpc.SetTrailer(sc, sc.st.dontRetryTrailer())
	}
	return resp, err
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
