package interceptor

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stormguard/stormguard/breaker"
)

// DefaultReplayBufferSize is the default limit of the replay buffer of a
// stream: the same as grpc-go's per-RPC retry buffer.
const DefaultReplayBufferSize = 256 << 10

// WithReplayBufferSize sets how many bytes of sent messages a stream keeps
// for replay until it commits; a stream that sends more commits at once
// and is not retried after that. Default DefaultReplayBufferSize (256 KiB).
// Client side, streams only.
func WithReplayBufferSize(n int) Option {
	return Option{apply: func(c *config) error {
		if n < 0 {
			return invalid("WithReplayBufferSize(%d): negative", n)
		}
		c.replayLimit = n
		return nil
	}}
}

// StreamClientInterceptor returns the retrying client interceptor for
// streams, with the same options, metadata, budget, breaker and "do not
// retry" signal as UnaryClientInterceptor.
//
// A stream is retried only until it commits, as gRFC A6 prescribes: when
// the first response message or header arrives, or when the messages sent
// outgrow the replay buffer (WithReplayBufferSize). Until then every message
// the application sends is kept (a copy, for protobuf messages), and a
// retryable failure opens a new stream and sends them again, in order.
// After the commit, a failure goes to the application: nothing is replayed,
// and nothing it received is delivered twice. Messages that are not
// protobuf messages cannot be copied or sized; sending one commits the
// stream. The per-attempt timeout does not apply to streams.
//
// The breaker sees each attempt once: Allow when it opens and the final
// status when it ends (an attempt its caller abandons counts for nothing).
// A half-open probe is the exception: it is reported as a success as soon
// as the target answers (a header or a message), so that a long-lived
// healthy stream does not hold one of the few probe slots for its whole
// life. DeadlineExceeded is never retried on a stream.
//
// Invalid options make every stream fail with codes.Internal; use New to
// get the error at start-up.
func StreamClientInterceptor(opts ...Option) grpc.StreamClientInterceptor {
	i, err := New(opts...)
	if err != nil {
		return func(context.Context, *grpc.StreamDesc, *grpc.ClientConn, string, grpc.Streamer, ...grpc.CallOption) (grpc.ClientStream, error) {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return i.StreamClient()
}

func (cl *client) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cfg, err := cl.callConfig(opts)
	if err != nil {
		return nil, err
	}
	s := &retryStream{desc: desc, cc: cc, method: method, streamer: streamer, opts: opts, limit: cfg.replayLimit}
	s.c.init(ctx, cfg, cc.Target(), method)
	for {
		started, wait, err := s.open()
		if err != nil {
			return nil, err
		}
		if started {
			return s, nil
		}
		if err := cfg.sleep(ctx, wait); err != nil {
			return nil, s.c.stop(StopCanceled)
		}
	}
}

// retryStream is the stream the application holds: it forwards to the
// current attempt's stream and replaces it on a retryable failure before
// the commit.
//
// Locking: sendMu serializes SendMsg, CloseSend and the replay into a new
// attempt, so that no message is sent twice to one attempt or lost between
// two. mu guards the fields below it and is never held across network
// calls. Only RecvMsg (and the initial open) starts new attempts, and gRPC
// allows one RecvMsg at a time.
type retryStream struct {
	c        call
	desc     *grpc.StreamDesc
	cc       *grpc.ClientConn
	method   string
	streamer grpc.Streamer
	opts     []grpc.CallOption
	limit    int

	sendMu     sync.Mutex
	halfClosed bool            // CloseSend was called; guarded by sendMu
	buf        []proto.Message // copies of the messages sent before the commit; guarded by sendMu
	bufBytes   int             // guarded by sendMu

	mu        sync.Mutex
	cur       *streamAttempt
	committed bool
	finished  bool
}

// streamAttempt is one attempt of a stream: its gRPC stream, the cancel of
// its context, and its breaker permit until the outcome is reported.
type streamAttempt struct {
	cs      grpc.ClientStream
	cancel  context.CancelFunc
	permit  breaker.Permit // guarded by retryStream.mu
	settled bool           // the permit's outcome was reported; guarded by retryStream.mu
}

// take hands out a's permit for its outcome, once; later calls get the
// zero Permit, whose Done does nothing.
func (s *retryStream) take(a *streamAttempt) breaker.Permit {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.settled {
		return breaker.Permit{}
	}
	a.settled = true
	return a.permit
}

// answered reports a half-open probe as a success as soon as the target
// answered (a header or a message), so that a long-lived stream does not
// hold one of the breaker's few probe slots for its whole life.
func (s *retryStream) answered(a *streamAttempt) {
	s.mu.Lock()
	probe := !a.settled && a.permit.Probe()
	if probe {
		a.settled = true
	}
	s.mu.Unlock()
	if probe {
		a.permit.Done(breaker.Success)
	}
}

// open starts one attempt and replays the buffered messages into it. It
// reports whether the attempt is in place; if not, the wait before the
// next try, or the call's final error.
func (s *retryStream) open() (started bool, wait time.Duration, err error) {
	if s.isCommitted() {
		// The replay buffer overflowed while a retry was waiting: what
		// was sent can no longer be replayed.
		return false, 0, s.c.stop(StopCommitted)
	}
	permit, err := s.c.admit()
	if err != nil {
		return false, 0, err
	}
	mctx, _ := s.c.attemptContext(false)
	actx, cancel := context.WithCancel(mctx)
	cs, err := s.streamer(actx, s.desc, s.cc, s.method, s.opts...)
	if err != nil {
		cancel()
		wait, err := s.c.after(permit, err, nil)
		return false, wait, err
	}
	a := &streamAttempt{cs: cs, cancel: cancel, permit: permit}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.isCommitted() {
		cancel()
		permit.Done(breaker.Ignored)
		return false, 0, s.c.stop(StopCommitted)
	}
	// An error here means the attempt ended already; its status comes
	// from RecvMsg, which then retries.
	for _, m := range s.buf {
		if cs.SendMsg(m) != nil {
			break
		}
	}
	if s.halfClosed {
		_ = cs.CloseSend()
	}
	s.mu.Lock()
	s.cur = a
	s.mu.Unlock()
	// An attempt abandoned by its caller (context cancelled, RecvMsg never
	// called again) must not keep its permit: a half-open probe would hold
	// its slot forever.
	context.AfterFunc(actx, func() { s.take(a).Done(breaker.Ignored) })
	return true, 0, nil
}

func (s *retryStream) isCommitted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.committed
}

func (s *retryStream) commit() {
	s.mu.Lock()
	s.committed = true
	s.mu.Unlock()
}

func (s *retryStream) current() *streamAttempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// SendMsg sends m on the current attempt and, until the commit, keeps a
// copy for replay.
func (s *retryStream) SendMsg(m any) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	committed, finished, a := s.committed, s.finished, s.cur
	s.mu.Unlock()
	if finished {
		return a.cs.SendMsg(m)
	}
	kept := !committed && s.keep(m)
	err := a.cs.SendMsg(m)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF) && kept:
		// The attempt ended; RecvMsg will learn why and, if it retries,
		// replay m with the rest.
		return nil
	case kept:
		// m itself failed (too large, not encodable): the application
		// sees the error, and a replay must not send m again.
		s.buf = s.buf[:len(s.buf)-1]
		s.bufBytes -= proto.Size(m.(proto.Message))
	}
	return err
}

// keep adds a copy of m to the replay buffer. It returns false, and
// commits the stream, when m cannot be kept: it is not a protobuf message,
// or the buffer would outgrow its limit. Called with sendMu held.
func (s *retryStream) keep(m any) bool {
	pm, ok := m.(proto.Message)
	if !ok || s.bufBytes+proto.Size(pm) > s.limit {
		s.buf, s.bufBytes = nil, 0
		s.commit()
		return false
	}
	s.bufBytes += proto.Size(pm)
	s.buf = append(s.buf, proto.Clone(pm))
	return true
}

// CloseSend half-closes the current attempt and every later one.
func (s *retryStream) CloseSend() error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.halfClosed = true
	return s.current().cs.CloseSend()
}

// Header returns the current attempt's header. Headers are the first sign
// of a response: a stream whose header arrived is committed.
func (s *retryStream) Header() (metadata.MD, error) {
	a := s.current()
	md, err := a.cs.Header()
	if err == nil && md != nil {
		s.commit()
		s.answered(a)
	}
	return md, err
}

// Trailer returns the current attempt's trailer.
func (s *retryStream) Trailer() metadata.MD { return s.current().cs.Trailer() }

// Context returns the current attempt's context.
func (s *retryStream) Context() context.Context { return s.current().cs.Context() }

// RecvMsg receives from the current attempt. A retryable failure before
// the commit starts the next attempt, which gets the buffered messages
// again; the application sees only the final outcome.
func (s *retryStream) RecvMsg(m any) error {
	for {
		a := s.current()
		err := a.cs.RecvMsg(m)
		if err == nil {
			s.commit()
			s.answered(a)
			if !s.desc.ServerStreams {
				// The one response of a client stream: gRPC has seen
				// the end of the stream too, so the call is over.
				s.markFinished()
				return s.end(a, nil)
			}
			return nil
		}
		s.mu.Lock()
		finished, committed := s.finished, s.committed
		s.finished = finished || committed || errors.Is(err, io.EOF)
		s.mu.Unlock()
		if finished {
			return err
		}
		if committed || errors.Is(err, io.EOF) {
			return s.end(a, err)
		}
		wait, final := s.c.after(s.take(a), err, a.cs.Trailer())
		for final == nil {
			a.cancel()
			if err := s.c.cfg.sleep(s.c.ctx, wait); err != nil {
				final = s.c.stop(StopCanceled)
				break
			}
			var started bool
			if started, wait, final = s.open(); started {
				break // a new attempt is in place: receive from it
			}
		}
		if final != nil {
			s.markFinished()
			s.current().cancel()
			return final
		}
	}
}

func (s *retryStream) markFinished() {
	s.mu.Lock()
	s.finished = true
	s.mu.Unlock()
}

// end finishes a stream that succeeded (err nil or io.EOF) or failed after
// its commit: the outcome goes to the breaker and the limiter, and a
// retryable failure that could no longer be retried marks the request
// this call serves.
func (s *retryStream) end(a *streamAttempt, err error) error {
	defer a.cancel()
	if err == nil || errors.Is(err, io.EOF) {
		s.c.settle(s.take(a), nil, a.cs.Trailer())
		return err
	}
	s.c.settle(s.take(a), err, a.cs.Trailer())
	if s.c.retryable(status.Code(err)) {
		s.c.last = err
		s.c.giveUp(StopCommitted)
	}
	return err
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
	sc := s.begin(ss.Context(), info.FullMethod)
	a, err := s.admit(sc, info.FullMethod, ss)
	if err != nil {
		return err
	}
	defer a.done(true)
	err = handler(srv, &serverStream{ServerStream: ss, ctx: sc})
	if s.dontRetryNeeded(sc, info.FullMethod, err) {
		ss.SetTrailer(sc.st.dontRetryTrailer())
	}
	return err
}
