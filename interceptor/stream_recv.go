package interceptor

import (
	"errors"
	"io"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/emptypb"
)

// RecvMsg receives from the current attempt. A retryable failure before
// the commit starts the next attempt, which gets the buffered messages
// again; the application sees only the final outcome.
func (s *retryStream) RecvMsg(m any) error {
	if a := s.settledOn.Load(); a != nil {
		return s.recvSettled(a, m)
	}
	for {
		if done, err := s.recvStep(m); done {
			return err
		}
	}
}

// recvSettled receives from a, the attempt a server stream settled on:
// it delivered a message, so the stream is committed and no attempt will
// replace it, and a message needs neither drive nor a lock. The end of
// the stream is handled as recvDriving handles it.
func (s *retryStream) recvSettled(a *streamAttempt, m any) error {
	returned := false
	defer func() {
		if !returned { // a panic: see release
			s.settle(a, panicked)
		}
	}()
	err := a.cs.RecvMsg(m)
	returned = true
	if err == nil {
		return nil
	}
	s.drive <- struct{}{}
	defer func() { <-s.drive }()
	_, err = s.failed(a, err)
	return err
}

// recvStep receives once from the current attempt, holding drive. It
// reports whether RecvMsg is done (with err), or a new attempt is in place
// to receive from. Between steps drive is free, so that a Header waiting
// for it learns of the new attempt.
func (s *retryStream) recvStep(m any) (done bool, err error) {
	s.drive <- struct{}{}
	returned := false
	defer s.release(&returned)
	done, err = s.recvDriving(m)
	returned = true
	return done, err
}

// release gives drive back. On a panic (returned is false), it also frees
// the current attempt's breaker permit and ends the attempt: a panic that
// a recovery interceptor turns into an error must not keep a half-open
// probe's slot.
func (s *retryStream) release(returned *bool) {
	<-s.drive
	if !*returned {
		a := s.current()
		s.settle(a, panicked)
		a.cancel()
	}
}

// recvDriving is recvStep's work, with drive held.
func (s *retryStream) recvDriving(m any) (done bool, err error) {
	s.mu.Lock()
	a, final := s.cur, s.final
	s.mu.Unlock()
	if final != nil {
		return true, final
	}
	err = a.cs.RecvMsg(m)
	if err == nil {
		s.commit()
		s.answered(a)
		if s.desc.ServerStreams {
			s.settledOn.Store(a)
		} else {
			// The one response of a client stream: gRPC has seen the end
			// of the stream too, so the call is over.
			s.markFinished()
			return true, s.end(a, nil)
		}
		return true, nil
	}
	retried, err := s.failed(a, err)
	return !retried, err
}

// failed handles the end of attempt a with err; the caller holds drive. It
// returns true if a new attempt is in place, or else the error the
// application gets.
//
// gRFC A6: an attempt whose response headers arrived committed the stream,
// even when no message followed. gRPC's Header on an attempt that ended
// returns at once: a non-nil MD if headers arrived, nil for a
// trailers-only response (the server failed before sending any), which
// stays retryable.
func (s *retryStream) failed(a *streamAttempt, err error) (retried bool, final error) {
	eof := errors.Is(err, io.EOF)
	if !eof && !s.isCommitted() {
		if md, _ := a.cs.Header(); md != nil {
			s.commit()
			a.answered.Store(true)
		}
	}
	s.mu.Lock()
	finished, committed := s.finished, s.committed
	s.finished = finished || committed || eof
	s.mu.Unlock()
	switch {
	case finished:
		return false, err
	case committed || eof:
		return false, s.end(a, err)
	}
	wait, final := s.c.next(err, s.ended(a, err))
	for final == nil {
		a.cancel()
		if err := s.c.cfg.sleep(s.c.ctx, wait); err != nil {
			final = s.c.canceled()
			break
		}
		var started bool
		if started, wait, final = s.open(); started {
			return true, nil // a new attempt is in place: receive from it
		}
	}
	s.mu.Lock()
	s.finished, s.final = true, final
	cur := s.cur
	s.mu.Unlock()
	cur.cancel()
	return false, final
}

// Header returns the header of the attempt that delivers the stream's
// messages. Headers are the first sign of a response: a stream whose
// header arrived is committed.
//
// When the current attempt ended without headers (gRPC's Header returns
// nil, nil) and the stream may still be retried, Header does what RecvMsg
// would: it reads the attempt's status and, if that is retryable, starts
// the next attempt and returns that one's header. As with gRPC, a stream
// that ends without headers gives nil, nil; RecvMsg then returns its
// status.
func (s *retryStream) Header() (metadata.MD, error) {
	for {
		a := s.current()
		md, err := a.cs.Header()
		if md != nil {
			s.commit()
			s.answered(a)
			return md, err
		}
		s.mu.Lock()
		cur, settled := s.cur, s.committed || s.finished
		s.mu.Unlock()
		switch {
		case cur != a:
			continue // a RecvMsg replaced a meanwhile: the new attempt's header
		case settled:
			return md, err
		}
		if !s.headerStep(a) {
			return nil, nil
		}
	}
}

// headerStep learns, holding drive, why attempt a ended without headers,
// and retries it as RecvMsg would. It reports whether a new attempt is in
// place (by this call or by a RecvMsg meanwhile), whose header Header
// then reads.
func (s *retryStream) headerStep(a *streamAttempt) bool {
	if !s.acquireFor(a) {
		return true // a is no longer current: the new attempt's header
	}
	returned := false
	defer s.release(&returned)
	more := s.headerDriving(a)
	returned = true
	return more
}

// acquireFor takes drive to settle attempt a, which ended without
// headers. It gives up, returning false, when a RecvMsg replaced a
// meanwhile: that RecvMsg may hold drive while it waits for a message of
// the new attempt, which could depend on what the caller of Header sends
// next.
func (s *retryStream) acquireFor(a *streamAttempt) bool {
	for {
		select {
		case s.drive <- struct{}{}:
			return true
		default:
		}
		s.mu.Lock()
		if s.cur != a {
			s.mu.Unlock()
			return false
		}
		if s.replaced == nil {
			s.replaced = make(chan struct{})
		}
		ch := s.replaced
		s.mu.Unlock()
		select {
		case s.drive <- struct{}{}:
			return true
		case <-ch:
		}
	}
}

// headerDriving is headerStep's work, with drive held.
func (s *retryStream) headerDriving(a *streamAttempt) bool {
	s.mu.Lock()
	cur, done := s.cur, s.committed || s.finished
	s.mu.Unlock()
	if cur != a {
		return true
	}
	if done {
		return false
	}
	// a ended without headers, so it has no message to deliver: the
	// throwaway message is never filled, and RecvMsg returns the status.
	err := a.cs.RecvMsg(new(emptypb.Empty))
	if err == nil {
		// A message without headers breaks the protocol (gRPC never
		// delivers one): commit, and let RecvMsg go on from there.
		s.commit()
		return false
	}
	retried, _ := s.failed(a, err)
	return retried
}
