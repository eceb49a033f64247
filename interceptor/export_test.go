package interceptor

import (
	"context"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"math"
	"time"
)

// withRand sets the jitter's random source.
func withRand(f func() float64) Option {
	return Option{apply: func(c *config) error { c.rand = f; return nil }}
}

// withNow replaces the clock that an attempt's end is read from, to
// compare it with the attempt's deadline.
func withNow(f func() time.Time) Option {
	return Option{apply: func(c *config) error { c.now = f; return nil }}
}

// withSleep replaces the wait between attempts.
func withSleep(f func(ctx context.Context, d time.Duration) error) Option {
	return Option{apply: func(c *config) error { c.sleep = f; return nil }}
}

// noSleep records the waits and returns at once (or with the context's
// error, as the real wait would).
type sleeps struct{ d []time.Duration }

func (s *sleeps) option() Option {
	return withSleep(func(ctx context.Context, d time.Duration) error {
		s.d = append(s.d, d)
		return ctx.Err()
	})
}

func insecureCreds() credentials.TransportCredentials { return insecure.NewCredentials() }

func sqrt(x float64) float64 { return math.Sqrt(x) }

// withHold replaces the wait of a first attempt refused because its
// target is down (see call.holdDown).
func withHold(f func(ctx context.Context, d time.Duration, back <-chan struct{}) error) Option {
	return Option{apply: func(c *config) error { c.hold = f; return nil }}
}
