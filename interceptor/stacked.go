package interceptor

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc/grpclog"
)

var logger = grpclog.Component("stormguard")

// stackedWarned makes the log line of stackedRetry once per process.
var stackedWarned atomic.Bool

// stackedRetry reports a request whose caller runs grpc-go's built-in
// retry under a retrying client interceptor (stormguard's, or
// go-grpc-middleware's): an EventStackedRetry for every such request, and
// a warning through grpclog once per process. It can only see it on the
// attempts of grpc-go's retry that carry our metadata: those of a call
// made inside a handler, or of a retry of ours; and only on a server that
// reads the request's metadata, which it does on first need (a handler
// that calls on, an observer, admission control refusing): a leaf tier
// with no observer reports nothing.
func (s *server) stackedRetry(ctx context.Context, method string, in Info) {
	if s.observer != nil {
		s.observer.Observe(ctx, Event{Kind: EventStackedRetry, Method: method, Info: in})
	}
	if stackedWarned.CompareAndSwap(false, true) {
		logger.Warningf("request for %s carries %s and %s: the caller runs grpc-go's built-in retry under a retrying interceptor, which multiplies attempts; "+
			"dial with Interceptors.DialOptions, or add grpc.WithDisableRetry()", method, MetadataPreviousAttempts, MetadataDepth+"/"+MetadataAttempt)
	}
}
