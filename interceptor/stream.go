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
// the response headers or the first response message arrive (an attempt
// that failed after sending headers is not retried), when the messages
// sent outgrow the replay buffer (WithReplayBufferSize), or when the
// application calls Context or Trailer, which commit as grpc-go's own
// retrying stream does: the context the caller holds is never cancelled
// by a retry. Until then every message the application sends is kept (a
// copy, for protobuf messages), and a retryable failure opens a new stream
// and sends them again, in order. After the commit, a failure goes to the
// application: nothing is replayed, and nothing it received is delivered
// twice. Messages that are not protobuf messages cannot be copied or
// sized; sending one commits the stream. Header waits for the headers of
// the attempt that answers: if an attempt ends without headers, Header
// retries it as RecvMsg would. The per-attempt timeout does not apply to
// streams.
//
// The breaker sees each attempt once: Allow when it opens and the final
// status when it ends. An attempt its caller cancels counts for nothing;
// one still unanswered when the caller's deadline expires counts as a
// failure (see the rule on UnaryClientInterceptor). A half-open probe is
// reported as a success as soon as the target answers (a header or a
// message), so that a long-lived healthy stream does not hold one of the
// few probe slots for its whole life. DeadlineExceeded is never retried on
// a stream.
//
// Use it with grpc.WithDisableRetry (DialOptions does both): with
// grpc.WithChainStreamInterceptor alone, a service config retry policy
// stays on underneath and multiplies its attempts unseen.
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
	s := &retryStream{desc: desc, cc: cc, method: method, streamer: streamer, opts: opts, limit: cfg.replayLimit, drive: make(chan struct{}, 1)}
	s.c.init(ctx, cfg, cl.target(cc), method)
	s.c.conn = cc
	for {
		started, wait, err := s.open()
		if err != nil {
			return nil, err
		}
		if started {
			return s, nil
		}
		if err := cfg.sleep(ctx, wait); err != nil {
			return nil, s.c.canceled()
		}
	}
}

// retryStream is the stream the application holds: it forwards to the
// current attempt's stream and replaces it on a retryable failure before
// the commit.
//
// Locking: sendMu serializes SendMsg, CloseSend and the replay into a new
// attempt, so that no message is sent twice to one attempt or lost between
// two. drive is the right to receive from the current attempt and to
// replace it (see recvStep). mu guards the fields below it and is never
// held across network calls.
type retryStream struct {
	c        call // its fields are used by the holder of drive, or before the stream is handed out
	desc     *grpc.StreamDesc
	cc       *grpc.ClientConn
	method   string
	streamer grpc.Streamer
	opts     []grpc.CallOption
	limit    int

	sendMu     sync.Mutex
	halfClosed bool // CloseSend was called; guarded by sendMu

	// drive is a semaphore of one: RecvMsg holds it while it receives,
	// and Header when it must learn why an attempt ended without headers.
	// A channel, so that a Header waiting for it gets it as soon as
	// RecvMsg lets go, before RecvMsg takes it again.
	drive chan struct{}

	mu        sync.Mutex
	buf       []proto.Message // copies of the messages sent before the commit; nil after it
	bufBytes  int
	cur       *streamAttempt
	committed bool
	finished  bool
	final     error         // the error stormguard ended the stream with, if it did
	replaced  chan struct{} // closed when cur changes; made by a waiting Header

	reporting sync.WaitGroup // outcomes abandoned is reporting; see take
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
// zero Permit, whose Done does nothing. If abandoned took it, take waits
// until that outcome is reported, so that the breaker has counted the
// attempt when the application learns how it ended.
func (s *retryStream) take(a *streamAttempt) breaker.Permit {
	s.mu.Lock()
	if a.settled {
		s.mu.Unlock()
		s.reporting.Wait()
		return breaker.Permit{}
	}
	a.settled = true
	s.mu.Unlock()
	return a.permit
}

// answered notes that the target answered a (a header or a message) and
// reports a half-open probe as a success at once, so that a long-lived
// stream does not hold one of the breaker's few probe slots for its whole
// life.
//
// An answer also proves the target alive to the adaptive throttle: a
// probe stream that the target answers revives it at once, not when the
// stream ends (which may be never).
func (s *retryStream) answered(a *streamAttempt) {
	s.c.answered.Store(true)
	if thr := s.c.thr; thr != nil && thr.Down() {
		thr.Revive()
	}
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

// abandoned reports the outcome of an attempt whose context ended before
// its status was read: the caller cancelled (Ignored), or its deadline
// expired before the target answered (a hang: Failure; see call.settle).
func (s *retryStream) abandoned(a *streamAttempt) {
	s.mu.Lock()
	if a.settled {
		s.mu.Unlock()
		return
	}
	a.settled = true
	s.reporting.Add(1)
	s.mu.Unlock()
	defer s.reporting.Done()
	if s.c.hung() {
		a.permit.Done(breaker.Failure)
		return
	}
	a.permit.Done(breaker.Ignored)
}

// open starts one attempt and replays the buffered messages into it. It
// reports whether the attempt is in place; if not, the wait before the
// next try, or the call's final error. The breaker permit is released on
// every way out, a panic in the streamer or in the replay included.
func (s *retryStream) open() (started bool, wait time.Duration, err error) {
	if s.isCommitted() {
		// The stream committed while a retry was waiting (its replay
		// buffer overflowed, or Context was called): what was sent can no
		// longer be replayed.
		return false, 0, s.c.stop(StopCommitted)
	}
	permit, err := s.c.admit()
	if err != nil {
		return false, 0, err
	}
	held, cancel := permit, context.CancelFunc(nil)
	defer func() { // only on a panic: both are cleared on the way out
		if cancel != nil {
			cancel()
		}
		held.Done(breaker.Ignored)
	}()
	mctx, _ := s.c.attemptContext(false)
	actx, acancel := context.WithCancel(mctx)
	cancel = acancel
	cs, err := s.streamer(actx, s.desc, s.cc, s.method, s.opts...)
	if err != nil {
		acancel()
		held, cancel = breaker.Permit{}, nil
		wait, err := s.c.after(permit, err, nil)
		return false, wait, err
	}
	a := &streamAttempt{cs: cs, cancel: acancel, permit: permit}
	// From here a holds the permit. An attempt abandoned by its caller
	// (context done, RecvMsg never called again) must not keep it: a
	// half-open probe would hold its slot forever.
	held = breaker.Permit{}
	context.AfterFunc(actx, func() { s.abandoned(a) })
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	// The stream may commit while this attempt opens (Context, Trailer,
	// a send that outgrows the buffer): then the attempt is dropped
	// unused, before and after the replay, and the stream ends with the
	// last attempt's error. An attempt installed after the commit would
	// be a retry after it, behind the context the caller holds.
	dropCommitted := func() (bool, time.Duration, error) {
		acancel()
		cancel = nil
		s.take(a).Done(breaker.Ignored)
		return false, 0, s.c.stop(StopCommitted)
	}
	s.mu.Lock()
	committed, buf := s.committed, s.buf
	s.mu.Unlock()
	if committed {
		return dropCommitted()
	}
	// An error here means the attempt ended already; its status comes
	// from RecvMsg, which then retries. buf is a snapshot: messages are
	// only appended under sendMu, and the commit drops the slice without
	// touching it.
	for _, m := range buf {
		if cs.SendMsg(m) != nil {
			break
		}
	}
	if s.halfClosed {
		_ = cs.CloseSend()
	}
	s.mu.Lock()
	if s.committed {
		s.mu.Unlock()
		return dropCommitted()
	}
	s.cur = a
	if s.replaced != nil {
		close(s.replaced)
		s.replaced = nil
	}
	s.mu.Unlock()
	cancel = nil
	return true, 0, nil
}

func (s *retryStream) isCommitted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.committed
}

// commit ends the retrying of the stream and frees its replay buffer.
func (s *retryStream) commit() {
	s.mu.Lock()
	s.commitLocked()
	s.mu.Unlock()
}

func (s *retryStream) commitLocked() {
	s.committed = true
	s.buf, s.bufBytes = nil, 0
}

func (s *retryStream) current() *streamAttempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// Trailer returns the trailer of the attempt that delivered the stream's
// status. Like grpc-go's, it commits the stream: it is only meaningful
// once RecvMsg returned an error.
func (s *retryStream) Trailer() metadata.MD {
	s.commit()
	return s.current().cs.Trailer()
}

// Context returns the context of the current attempt and, as grpc-go's
// own retrying stream does, commits the stream: no retry can replace the
// attempt whose context the caller holds, and cancel it under the
// caller's feet. A stream whose Context is called before its first
// response is therefore not retried.
func (s *retryStream) Context() context.Context {
	s.commit()
	return s.current().cs.Context()
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
