package interceptor

import (
	"errors"
	"io"

	"google.golang.org/protobuf/proto"
)

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
		// sees the error, and a replay must not send m again. (A commit
		// meanwhile dropped the whole buffer.)
		s.mu.Lock()
		if n := len(s.buf); n > 0 {
			s.buf = s.buf[:n-1]
			s.bufBytes -= proto.Size(m.(proto.Message))
		}
		s.mu.Unlock()
	}
	return err
}

// keep adds a copy of m to the replay buffer. It returns false, and
// commits the stream, when m cannot be kept: it is not a protobuf message,
// or the buffer would outgrow its limit. Called with sendMu held.
func (s *retryStream) keep(m any) bool {
	pm, ok := m.(proto.Message)
	var size int
	var c proto.Message
	if ok {
		size = proto.Size(pm)
		if size <= s.limit {
			c = proto.Clone(pm)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.committed:
		return false
	case c == nil || s.bufBytes+size > s.limit:
		s.commitLocked()
		return false
	}
	s.bufBytes += size
	s.buf = append(s.buf, c)
	return true
}

// CloseSend half-closes the current attempt and every later one.
func (s *retryStream) CloseSend() error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.halfClosed = true
	return s.current().cs.CloseSend()
}
