package interceptor

import (
	"errors"
	"io"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// SendMsg sends m on the current attempt and, until the commit, keeps its
// encoding for replay.
//
// An attempt that ended before the commit makes gRPC's SendMsg return
// io.EOF. If the stream can be retried, a new attempt replaces it (its
// backoff waited here) and gets m with the rest, and SendMsg returns nil;
// if not (its headers had come, or its status is not retried), SendMsg
// returns io.EOF, as gRPC does, and RecvMsg the status: a caller that
// sends until io.EOF stops there instead of sending into a stream that
// is over, which it did until the replay buffer overflowed.
func (s *retryStream) SendMsg(m any) error {
	if a := s.settledOn.Load(); a != nil {
		// Committed, nothing to keep: see recvSettled.
		return s.sendFailed(a, a.cs.SendMsg(m))
	}
	a, ended, err := s.send(m)
	if !ended {
		return err
	}
	if md, _ := a.cs.Header(); md != nil {
		// Headers came before the end: committed (gRFC A6), nothing to
		// replay; the caller reads the status from RecvMsg, where the
		// mechanisms hear how the attempt ended (as failed does, the
		// mechanisms are not told of an answer that the end followed:
		// the target may have died since, and be down).
		s.commit()
		a.answered.Store(true)
		return io.EOF
	}
	if s.headerStep(a) {
		return nil // a new attempt is in place, m replayed into it
	}
	return io.EOF
}

// send is SendMsg's work with sendMu held: it returns the attempt m went
// to, and either SendMsg's result or, with ended, that the attempt ended
// while m was kept for a replay.
func (s *retryStream) send(m any) (a *streamAttempt, ended bool, err error) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	committed, finished, a := s.committed, s.finished, s.cur
	s.mu.Unlock()
	if finished {
		return a, false, a.cs.SendMsg(m) // reported already
	}
	kept := !committed && s.keep(m)
	err = a.cs.SendMsg(m)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF) && kept:
		// The attempt ended: SendMsg learns why, without sendMu, which
		// a retry's replay takes.
		return a, true, nil
	case kept:
		// m itself failed (too large, not encodable): the application
		// sees the error, and a replay must not send m again. (A commit
		// meanwhile dropped the whole buffer.)
		s.mu.Lock()
		if n := len(s.buf); n > 0 {
			s.bufBytes -= len(s.buf[n-1].b)
			s.buf = s.buf[:n-1]
		}
		s.mu.Unlock()
	}
	return a, false, s.sendFailed(a, err)
}

// sendFailed returns err, SendMsg's on attempt a. An error other than
// io.EOF is the client's own (a message over the size limit, a send
// after CloseSend), and gRPC ended the stream with it: the caller may
// stop there and never call RecvMsg. So a's context is cancelled (a
// retry's own; the first attempt runs in the caller's), and the
// mechanisms that hold a slot for a (a half-open breaker's probe) hear
// that it ended, as for an attempt its caller abandoned. The others hear
// its status if RecvMsg reads it.
func (s *retryStream) sendFailed(a *streamAttempt, err error) error {
	if err != nil && !errors.Is(err, io.EOF) {
		a.cancel()
		if a.mustReport {
			s.abandoned(a)
		}
		if a.unwatch != nil {
			a.unwatch() // the caller's context may outlive the stream
		}
	}
	return err
}

// kept is a message sent before the commit, kept for replay: its
// encoding (one allocation, where a clone of the message takes one per
// field that holds bytes or a message) and its type.
type kept struct {
	b   []byte
	typ protoreflect.MessageType
}

// message decodes k again, for a replay.
func (k kept) message() (proto.Message, error) {
	m := k.typ.New().Interface()
	return m, proto.Unmarshal(k.b, m)
}

// keep adds m's encoding to the replay buffer. It returns false, and
// commits the stream, when m cannot be kept: it is not a protobuf message,
// it does not encode, or the buffer would outgrow its limit. Called with
// sendMu held.
func (s *retryStream) keep(m any) bool {
	var k kept
	ok := false
	if pm, isProto := m.(proto.Message); isProto {
		if size := proto.Size(pm); size <= s.limit {
			b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(make([]byte, 0, size), pm)
			k, ok = kept{b: b, typ: pm.ProtoReflect().Type()}, err == nil
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.committed:
		return false
	case !ok || s.bufBytes+len(k.b) > s.limit:
		s.commitLocked()
		return false
	}
	s.bufBytes += len(k.b)
	if s.buf == nil {
		s.buf = s.first1[:0]
	}
	s.buf = append(s.buf, k)
	return true
}

// CloseSend half-closes the current attempt and every later one.
func (s *retryStream) CloseSend() error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.halfClosed = true
	return s.current().cs.CloseSend()
}
