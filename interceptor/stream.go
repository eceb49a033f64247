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
// status when it ends. A half-open probe is the exception: it is reported
// as a success as soon as the stream commits (the target answered), so
// that a long-lived healthy stream does not hold one of the few probe
// slots for its whole life.
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
		wait, err := s.open()
		if err != nil || wait < 0 {
			return nil, err
		}
		if wait == 0 {
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
	halfClosed bool  // CloseSend was called; guarded by sendMu
	buf        []any // messages sent before the commit; guarded by sendMu
	bufBytes   int   // guarded by sendMu

	mu        sync.Mutex
	cur       grpc.ClientStream
	cancel    context.CancelFunc // ends cur's attempt
	permit    breaker.Permit
	committed bool
	finished  bool
}

// open starts one attempt and replays the buffered messages into it. It
// returns a zero wait when the attempt is in place, a positive wait before
// the next try when the attempt could not start, or a negative wait and the
// final error.
func (s *retryStream) open() (time.Duration, error) {
	permit, err := s.c.admit()
	if err != nil {
		return -1, err
	}
	actx, cancelMeta := s.c.attemptContext(false)
	actx, cancel := context.WithCancel(actx)
	cs, err := s.streamer(actx, s.desc, s.cc, s.method, s.opts...)
	if err != nil {
		cancel()
		cancelMeta()
		return s.c.after(permit, err, nil)
	}
	s.sendMu.Lock()
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
	s.cur, s.permit = cs, permit
	s.cancel = func() { cancel(); cancelMeta() }
	s.mu.Unlock()
	s.sendMu.Unlock()
	return 0, nil
}

// commitLocked ends the retry window. Called with mu held.
func (s *retryStream) commitLocked() {
	if s.committed {
		return
	}
	s.committed = true
	if s.permit.Probe() {
		s.permit.Done(breaker.Success)
		s.permit = breaker.Permit{}
	}
}

func (s *retryStream) current() grpc.ClientStream {
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
	committed, finished := s.committed, s.finished
	cs := s.cur
	s.mu.Unlock()
	if finished {
		return cs.SendMsg(m)
	}
	if !committed {
		committed = !s.keep(m)
	}
	err := cs.SendMsg(m)
	if errors.Is(err, io.EOF) && !committed {
		// The attempt ended; RecvMsg will learn why and, if it retries,
		// replay m with the rest.
		return nil
	}
	return err
}

// keep adds a copy of m to the replay buffer. It returns false, and
// commits the stream, when m cannot be kept. Called with sendMu held.
func (s *retryStream) keep(m any) bool {
	pm, ok := m.(proto.Message)
	if ok {
		s.bufBytes += proto.Size(pm)
	}
	if !ok || s.bufBytes > s.limit {
		s.buf, s.bufBytes = nil, 0
		s.mu.Lock()
		s.commitLocked()
		s.mu.Unlock()
		return false
	}
	s.buf = append(s.buf, proto.Clone(pm))
	return true
}

// CloseSend half-closes the current attempt and every later one.
func (s *retryStream) CloseSend() error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.halfClosed = true
	return s.current().CloseSend()
}

// Header returns the current attempt's header. Headers are the first sign
// of a response: a stream whose header arrived is committed.
func (s *retryStream) Header() (metadata.MD, error) {
	md, err := s.current().Header()
	if err == nil && md != nil {
		s.mu.Lock()
		s.commitLocked()
		s.mu.Unlock()
	}
	return md, err
}

// Trailer returns the current attempt's trailer.
func (s *retryStream) Trailer() metadata.MD { return s.current().Trailer() }

// Context returns the current attempt's context.
func (s *retryStream) Context() context.Context { return s.current().Context() }

// RecvMsg receives from the current attempt. A retryable failure before
// the commit starts the next attempt, which gets the buffered messages
// again; the application sees only the final outcome.
func (s *retryStream) RecvMsg(m any) error {
	for {
		cs := s.current()
		err := cs.RecvMsg(m)
		s.mu.Lock()
		if err == nil {
			s.commitLocked()
			s.mu.Unlock()
			return nil
		}
		if s.finished {
			s.mu.Unlock()
			return err
		}
		permit, committed := s.permit, s.committed
		s.permit = breaker.Permit{}
		if errors.Is(err, io.EOF) || committed {
			s.finished = true
			s.mu.Unlock()
			return s.finish(permit, err, cs.Trailer())
		}
		s.mu.Unlock()
		wait, final := s.c.after(permit, err, cs.Trailer())
		for final == nil && wait >= 0 {
			s.cancelCurrent()
			if err := s.c.cfg.sleep(s.c.ctx, wait); err != nil {
				final = s.c.stop(StopCanceled)
				break
			}
			wait, final = s.open()
			if final == nil && wait == 0 {
				break // a new attempt is in place: receive from it
			}
		}
		if final != nil {
			s.mu.Lock()
			s.finished = true
			s.mu.Unlock()
			s.cancelCurrent()
			return final
		}
	}
}

// finish ends a stream that succeeded (io.EOF) or failed after its
// commit: the outcome goes to the breaker and the limiter, and a retryable
// failure that could not be retried marks the request this call serves.
func (s *retryStream) finish(permit breaker.Permit, err error, trailer metadata.MD) error {
	defer s.cancelCurrent()
	if errors.Is(err, io.EOF) {
		s.c.settle(permit, nil, trailer)
		return err
	}
	s.c.settle(permit, err, trailer)
	if s.c.cfg.isRetryable(status.Code(err)) {
		s.c.last = err
		s.c.giveUp(StopCommitted)
	}
	return err
}

func (s *retryStream) cancelCurrent() {
	s.mu.Lock()
	cancel := s.cancel
	s.cancel = nil
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
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
	err := handler(srv, &serverStream{ServerStream: ss, ctx: sc})
	if s.dontRetryNeeded(sc, info.FullMethod, err) {
		ss.SetTrailer(dontRetry)
	}
	return err
}
