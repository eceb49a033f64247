package interceptor

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// DefaultReplayBufferSize is the default limit of the replay buffer of a
// stream: the same as grpc-go's per-RPC retry buffer.
const DefaultReplayBufferSize = 256 << 10

// WithReplayBufferSize sets how many bytes of sent messages a stream keeps
// for replay until it commits; a stream that sends more commits at once
// and is not retried after that. Default DefaultReplayBufferSize (256 KiB).
// Client side, streams only; usable per call. An upload (client
// streaming) commits only when it is answered, at its end, so every
// client tier keeps a copy of what it sends, up to the limit: 0 on such a
// call keeps nothing, and retries it only before its first message.
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
// by a retry. Until then every message the application sends is kept (its
// encoding, for protobuf messages), and a retryable failure opens a new
// stream and sends them again, in order. After the commit, a failure goes
// to the application: nothing is replayed, and nothing it received is
// delivered twice. Messages that are not protobuf messages cannot be kept
// or sized; sending one commits the stream. Header waits for the headers of
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
	buf       []kept  // the messages sent before the commit; nil after it
	first1    [1]kept // buf's room for the first message (streams often send one)
	bufBytes  int
	cur       *streamAttempt
	committed bool
	finished  bool
	final     error         // the error stormguard ended the stream with, if it did
	replaced  chan struct{} // closed when cur changes; made by a waiting Header

	reporting sync.WaitGroup // outcomes abandoned is reporting; see settle

	first streamAttempt // the first attempt, in the same allocation
	out   mdContext     // its context (see withShared)
	// settledOn is the attempt a server stream settled on (it delivered a
	// message): from then on messages go straight to it (see recvSettled).
	settledOn atomic.Pointer[streamAttempt]
}

// streamAttempt is one attempt of a stream: its gRPC stream, the cancel of
// its context, and what the mechanisms keep for it until its outcome is
// reported.
type streamAttempt struct {
	attempt
	cs      grpc.ClientStream
	cancel  context.CancelFunc
	unwatch func() bool // stops the watch for its abandonment (see open), or nil
	settled bool        // its outcome was reported, or is being; guarded by retryStream.mu
}

// settle reports a's outcome o to the mechanisms, once. If abandoned is
// reporting a meanwhile, settle waits until it is done, so that the
// mechanisms have counted the attempt when the application learns how it
// ended.
func (s *retryStream) settle(a *streamAttempt, o outcome) {
	s.mu.Lock()
	if a.settled {
		s.mu.Unlock()
		return
	}
	a.settled = true
	s.mu.Unlock()
	if a.unwatch != nil {
		// Reported: the caller's context, which may live long after the
		// stream, no longer needs to reach the attempt (and its stream).
		a.unwatch()
	}
	s.c.report(&a.attempt, o)
	s.reporting.Wait()
}

// ended settles a, which ended with err, and returns its outcome. Only a
// failure's trailer is read: grpc-go copies it on every call.
func (s *retryStream) ended(a *streamAttempt, err error) outcome {
	var trailer metadata.MD
	if err != nil {
		trailer = a.cs.Trailer()
	}
	o := s.c.classify(&a.attempt, err, trailer)
	s.settle(a, o)
	return o
}

// answered notes that the target answered a (a header or a message): the
// mechanisms hear it at once (see answerer).
func (s *retryStream) answered(a *streamAttempt) { s.c.answered(&a.attempt) }

// abandoned reports the end of an attempt whose context ended before its
// status was read (the caller cancelled, or its deadline expired) to the
// mechanisms that hold a scarce slot for it (see abandoner): the caller
// may never call RecvMsg again. The others hear the outcome, with its
// status and trailer, when RecvMsg reads it.
func (s *retryStream) abandoned(a *streamAttempt) {
	s.mu.Lock()
	if a.settled {
		s.mu.Unlock()
		return
	}
	s.reporting.Add(1)
	s.mu.Unlock()
	defer s.reporting.Done()
	o := cancelledByUs
	if cerr := s.c.ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) && !a.answered.Load() {
			// Headers that came while no one asked for them are an
			// answer: a target that answered and was then cut off by the
			// caller's deadline is no hang. (gRPC's Header returns at once
			// for an attempt whose context ended.)
			if md, _ := a.cs.Header(); md != nil {
				a.answered.Store(true)
			}
		}
		o = s.c.classify(&a.attempt, status.FromContextError(cerr).Err(), nil)
	}
	s.c.abandoned(&a.attempt, o)
}

// open starts one attempt and replays the buffered messages into it. It
// reports whether the attempt is in place; if not, the wait before the
// next try, or the call's final error. The mechanisms hear of the attempt
// on every way out, a panic in the streamer or in the replay included.
func (s *retryStream) open() (started bool, wait time.Duration, err error) {
	if s.isCommitted() {
		// The stream committed while a retry was waiting (its replay
		// buffer overflowed, or Context was called): what was sent can no
		// longer be replayed.
		return false, 0, s.c.stop(StopCommitted)
	}
	a := &s.first
	if s.c.attempt > 0 {
		a = &streamAttempt{}
	}
	a.stream = true
	if err := s.c.begin(&a.attempt); err != nil {
		return false, 0, err
	}
	placed := false
	defer func() {
		if !placed { // a panic: it counts for nothing
			s.settle(a, panicked)
			if a.cancel != nil {
				a.cancel()
			}
		}
	}()
	actx := s.attemptContext(a)
	cs, err := s.streamer(actx, s.desc, s.cc, s.method, s.opts...)
	if err != nil {
		placed = true
		o := s.c.classify(&a.attempt, err, nil)
		s.settle(a, o)
		a.cancel()
		wait, err := s.c.next(err, o)
		return false, wait, err
	}
	a.cs = cs
	if a.mustReport {
		// Abandoned by its caller (context done, RecvMsg never called
		// again), the attempt must not keep its permit: a half-open
		// probe would hold its slot forever.
		a.unwatch = context.AfterFunc(actx, func() { s.abandoned(a) })
	}
	if !s.replayInto(a) {
		placed = true
		s.settle(a, cancelledByUs)
		a.cancel()
		return false, 0, s.c.stop(StopCommitted)
	}
	placed = true
	return true, 0, nil
}

// attemptContext returns the context of attempt a, and sets its cancel.
// A retry gets a context of its own, so that it can be dropped unused
// when the stream commits while it opens. The first attempt runs in the
// call's context: nothing can commit the stream before it is handed out,
// and an attempt that ended (its status read) holds nothing of gRPC's,
// so it needs no cancel.
func (s *retryStream) attemptContext(a *streamAttempt) context.Context {
	first := s.c.attempt == 0
	mctx, _ := s.c.attemptContext(false, &s.out)
	if first {
		a.cancel = func() {}
		return mctx
	}
	actx, cancel := context.WithCancel(mctx)
	a.cancel = cancel
	return actx
}

// replayInto sends the buffered messages (and the half-close) on a, and
// installs it as the current attempt. The stream may commit meanwhile
// (Context, Trailer, a send that outgrows the buffer): then a is dropped
// unused, before and after the replay, and replayInto returns false. An
// attempt installed after the commit would be a retry after it, behind
// the context the caller holds.
func (s *retryStream) replayInto(a *streamAttempt) bool {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	committed, buf := s.committed, s.buf
	var one [1]kept
	if len(buf) == 1 { // in first1, which the commit clears: copy it
		one[0] = buf[0]
		buf = one[:]
	}
	s.mu.Unlock()
	if committed {
		return false
	}
	// An error here means the attempt ended already; its status comes
	// from RecvMsg, which then retries. buf is a snapshot: messages are
	// only appended under sendMu, and the commit drops a grown slice
	// without touching it.
	for _, k := range buf {
		m, err := k.message()
		if err != nil || a.cs.SendMsg(m) != nil {
			break
		}
	}
	if s.halfClosed {
		_ = a.cs.CloseSend()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.committed {
		return false
	}
	s.cur = a
	if s.replaced != nil {
		close(s.replaced)
		s.replaced = nil
	}
	return true
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
	s.buf, s.bufBytes, s.first1 = nil, 0, [1]kept{}
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
// its commit: the outcome goes to the mechanisms, and a retryable failure
// that could no longer be retried marks the request this call serves.
func (s *retryStream) end(a *streamAttempt, err error) error {
	defer a.cancel()
	if err == nil || errors.Is(err, io.EOF) {
		s.ended(a, nil)
		return err
	}
	if s.ended(a, err).mayRetry() {
		s.c.last = err
		s.c.giveUp(StopCommitted)
	}
	return err
}
