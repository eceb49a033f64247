package interceptor

import (
	"context"
	"errors"

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
	// mechs are asked, in order, whether a request may run, and told how
	// its handler ended (see serverMechanism).
	mechs []serverMechanism
	room  *stackRoom // what unary handlers' stacks need (see stackroom.go)
}

// serverMechanism is one mechanism of the server interceptors: admission
// control, the server's own health. The interceptors ask each in turn
// whether a request may run, and tell each how its handler ended; they
// know none of them.
type serverMechanism interface {
	// admit reports whether the request sc serves may run: nil, or the
	// error it ends with (its trailer set on ss, or on the unary call
	// when ss is nil). A mechanism's refusal tells those before it
	// errNotRun.
	admit(s *server, sc *stateCtx, method string, ss grpc.ServerStream) error
	// done reports how the handler ended: its error, errPanicked, or
	// errNotRun.
	done(s *server, sc *stateCtx, err error)
}

var (
	// errPanicked is what the mechanisms hear of a handler that panicked.
	errPanicked = errors.New("stormguard: the handler panicked")
	// errNotRun is what they hear of a request a later mechanism refused.
	errNotRun = errors.New("stormguard: the request was refused before its handler")
)

// newServer builds the server interceptors' state from cfg.
func newServer(cfg *config) server {
	s := server{untrusted: cfg.untrusted, ignoreEnvoy: cfg.ignoreEnvoy, observer: cfg.observer, retryable: cfg.retryable, admission: cfg.admission, health: cfg.health, rand: cfg.rand, room: &stackRoom{}}
	// Health first: it notes the epoch a request starts in before the
	// request waits in admission's queue.
	if cfg.health != nil {
		s.mechs = append(s.mechs, cfg.health)
	}
	if cfg.admission != nil {
		s.mechs = append(s.mechs, (*admissionGuard)(cfg.admission))
	}
	return s
}

// admit asks every mechanism whether the request sc serves may run.
func (s *server) admit(sc *stateCtx, method string, ss grpc.ServerStream) error {
	for i, m := range s.mechs {
		if err := m.admit(s, sc, method, ss); err != nil {
			s.done(sc, s.mechs[:i], errNotRun)
			return err
		}
	}
	return nil
}

// done tells the mechanisms ms how the handler ended, the last asked
// first.
func (s *server) done(sc *stateCtx, ms []serverMechanism, err error) {
	for i := len(ms) - 1; i >= 0; i-- {
		ms[i].done(s, sc, err)
	}
}

// dontRetry is the trailer that tells the caller not to retry.
var dontRetry = metadata.Pairs(MetadataPushback, "-1")

// begin returns the handler's context, carrying the request's Info
// (parsed when first needed: see serverState).
func (s *server) begin(ctx context.Context, method string) *stateCtx {
	sc := &stateCtx{}
	s.beginIn(sc, ctx, method)
	return sc
}

// beginIn is begin, filling sc (part of a larger allocation).
func (s *server) beginIn(sc *stateCtx, ctx context.Context, method string) {
	sc.Context = ctx
	sc.st.srv, sc.st.in, sc.st.method = s, ctx, method
	if s.observer != nil {
		s.observer.Observe(ctx, Event{Kind: EventRequestReceived, Method: method, Info: sc.st.Info()})
	}
}

// parseInfo reads the Info of the request ctx serves for method from its
// metadata, and reports a stacked retry (see stackedRetry); the zero Info
// with WithUntrustedCallers.
func (s *server) parseInfo(ctx context.Context, method string) Info {
	if s.untrusted {
		return Info{}
	}
	md := incomingOf(ctx)
	in, stacked := incomingInfo(md)
	if stacked {
		s.stackedRetry(ctx, method, in)
	}
	if s.ignoreEnvoy {
		return in
	}
	return addEnvoyRetries(in, md.get)
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

// unary keeps its stack frame small, as the client's does (see
// unary.go): the handler runs below it.
func (s *server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if healthMethod(info.FullMethod) {
		return handler(ctx, req)
	}
	sc, err := s.enter(ctx, info.FullMethod)
	if sc == nil {
		return nil, err
	}
	defer sc.leftOnPanic()
	sc.mark = stackMark(&sc)
	var resp any
	if sc.roomMade {
		resp, err = inRoom(sc, req, handler)
	} else {
		resp, err = handler(sc, req)
	}
	return resp, sc.leave(err, stackMark(&sc))
}

// enter begins a unary request and asks the mechanisms whether it may
// run: its handler's context, or nil and the error it ends with. For a
// request that may run, it makes room on the stack for the handler if
// its method needs it (see stackroom.go).
func (s *server) enter(ctx context.Context, method string) (*stateCtx, error) {
	sc := s.begin(ctx, method)
	if err := s.admit(sc, method, nil); err != nil {
		return nil, err
	}
	sc.running = true
	sc.roomMade = s.room.of(method).before()
	return sc, nil
}

// leave ends a unary request whose handler returned err, mark being
// where the handler's stack is now (see stackMark): the mechanisms hear
// how it ended, and the caller is told "do not retry" if the handler's
// calls gave up. It returns err.
func (sc *stateCtx) leave(err error, mark uintptr) error {
	sc.running = false
	s, method := sc.st.srv, sc.st.method
	s.room.of(method).after(sc.roomMade, mark != sc.mark)
	s.done(sc, s.mechs, err)
	if s.dontRetryNeeded(sc, method, err) {
		_ = grpc.SetTrailer(sc, dontRetry)
	}
	return err
}

// leftOnPanic runs when unary returns: a handler still running panicked
// (see server.panicked).
func (sc *stateCtx) leftOnPanic() {
	if sc.running {
		sc.running = false
		sc.st.srv.panicked(sc, sc.st.method, func() { _ = grpc.SetTrailer(sc, dontRetry) })
	}
}

// panicked handles a handler that panics, from a deferred function that
// lets the panic go on: the mechanisms hear errPanicked, and if one of
// the handler's calls gave up, setTrailer sends "do not retry". A recovery
// interceptor further out may turn the panic into a retryable code;
// without the trailer the tier above would retry a request this tier
// already retried. The code is unknown here, so the trailer goes out
// whatever it will be (a caller ignores it on a code it does not retry
// anyway).
func (s *server) panicked(sc *stateCtx, method string, setTrailer func()) {
	s.done(sc, s.mechs, errPanicked)
	if !sc.st.gaveUp.Load() {
		return
	}
	if s.observer != nil {
		s.observer.Observe(sc, Event{Kind: EventPushbackSent, Method: method, Code: codes.Unknown, Info: sc.st.Info()})
	}
	setTrailer()
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

// serverStream gives a streaming handler the context with its Info,
// which it holds (one allocation for both).
type serverStream struct {
	grpc.ServerStream
	sc stateCtx
}

func (s *serverStream) Context() context.Context { return &s.sc }

func (s *server) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if healthMethod(info.FullMethod) {
		return handler(srv, ss)
	}
	w := &serverStream{ServerStream: ss}
	sc := &w.sc
	s.beginIn(sc, ss.Context(), info.FullMethod)
	if err := s.admit(sc, info.FullMethod, ss); err != nil {
		return err
	}
	returned := false
	defer func() {
		if !returned {
			s.panicked(sc, info.FullMethod, func() { ss.SetTrailer(dontRetry) })
		}
	}()
	err := handler(srv, w)
	returned = true
	s.done(sc, s.mechs, err)
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
