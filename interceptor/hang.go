package interceptor

import (
	"time"

	"google.golang.org/grpc/codes"
)

// deadlineAnswer reports whether an attempt that ended with code before
// the caller's context did is a hang all the same: DEADLINE_EXCEEDED that
// is not the attempt's own timeout, with no answer yet, on a call whose
// deadline has passed. The caller's deadline travels with the call, and
// the server's timer can fire before the caller's: grpc-go then ends the
// call with the server's RST_STREAM, reported as DEADLINE_EXCEEDED
// because the deadline has passed, while the caller's context is not yet
// done. Judged as an answer, such an attempt counted as an accept, and a
// probe that met a hanging target revived it (TestAdaptiveHangOverGRPC).
// A DEADLINE_EXCEEDED that comes before the caller's deadline (a tier
// below whose own timeout expired) stays an answer.
func (c *call) deadlineAnswer(code codes.Code) bool {
	if code != codes.DeadlineExceeded || c.timedOut || c.answered.Load() || c.ctx.Err() != nil {
		return false
	}
	dl, ok := c.ctx.Deadline()
	return ok && !time.Now().Before(dl)
}
