package interceptor

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ownTimeout reports whether an attempt made in actx that ended with err
// at now ran into its own per-attempt timeout, which alone makes
// DeadlineExceeded retryable. That is a DeadlineExceeded, while the
// caller's context is alive, of an attempt whose deadline was its own
// (earlier than the caller's) and had passed when the attempt ended.
//
// Whose timer fired first does not matter. The server's deadline is the
// attempt's, sent in grpc-timeout: gRPC computes it from the time left
// when the request goes out, rounded up, and the server starts it when
// the request arrives, so it never expires before the attempt's own.
// When the server's timer runs before the client's (timers are not
// ordered across threads, least of all on a loaded machine), its
// DeadlineExceeded arrives while actx.Err() is still nil, but never
// before actx's deadline: comparing the deadline with the time is exact
// where actx.Err() races. A DeadlineExceeded that arrives before the
// attempt's deadline is the server's own (a dependency of its timed out)
// and is not retried; one under the caller's deadline (the attempt's
// deadline is the caller's) is never retried either.
func (c *call) ownTimeout(actx context.Context, err error, now time.Time) bool {
	if c.cfg.perAttemptTimeout <= 0 || status.Code(err) != codes.DeadlineExceeded || c.ctx.Err() != nil {
		return false
	}
	adl, ok := actx.Deadline()
	if !ok || now.Before(adl) {
		return false
	}
	cdl, ok := c.ctx.Deadline()
	return !ok || adl.Before(cdl)
}
