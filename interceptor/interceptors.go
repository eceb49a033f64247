package interceptor

import "google.golang.org/grpc"

// Interceptors are the client and server interceptors built from one set
// of options. Most programs build one per process with New, and install
// DialOptions on every client connection and ServerOptions on the server.
type Interceptors struct {
	client client
	server server
}

// New validates opts and builds the interceptors. Its error names the
// first invalid option and wraps ErrInvalidOption. Options apply in
// order, and one given again replaces the earlier, so that
// append(Recommended(), WithBudget(cfg)) changes Recommended's budget;
// two different retry limiters (WithBudget, WithThrottle, WithLimiter)
// are an error. Given both WithObserver
// and WithBreaker, it reports the Set's breaker changes to the observer
// (see BreakerObserver).
func New(opts ...Option) (*Interceptors, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	wireBreakerObserver(&cfg)
	wireAdaptiveObserver(&cfg)
	if cfg.health != nil && cfg.observer != nil {
		cfg.health.setObserver(cfg.observer)
	}
	return &Interceptors{client: client{cfg: cfg}, server: newServer(&cfg)}, nil
}

// UnaryClient returns the unary client interceptor.
//
// Installed alone, with grpc.WithChainUnaryInterceptor, it leaves grpc-go's
// built-in retry on underneath: with a service config retry policy
// (maxAttempts 3) each of its attempts is retried again, unseen by the
// budget, the breaker and the metadata, and one request made 9 calls at
// payment instead of 3. Add grpc.WithDisableRetry() to the same
// connection, or use DialOptions, which does both. A server with these
// interceptors reports such a caller (EventStackedRetry, and one grpclog
// warning, which grpc-go prints only at GRPC_GO_LOG_SEVERITY_LEVEL=warning
// or info) when it sees a grpc-go retry of a call made inside a handler
// or of a retry of ours. Another retrying client interceptor on the same
// connection (go-grpc-middleware's retry) is not seen at all: under this
// one it retries each of its attempts, above it each of its retries is a
// new call. Remove it (docs/adopting.md, "One retry per client").
func (i *Interceptors) UnaryClient() grpc.UnaryClientInterceptor { return i.client.unary }

// UnaryServer returns the unary server interceptor.
func (i *Interceptors) UnaryServer() grpc.UnaryServerInterceptor { return i.server.unary }

// StreamClient returns the stream client interceptor. As for
// UnaryClient: add grpc.WithDisableRetry() to the connection, or use
// DialOptions, so that grpc-go's built-in retry does not multiply its
// attempts.
func (i *Interceptors) StreamClient() grpc.StreamClientInterceptor { return i.client.stream }

// StreamServer returns the stream server interceptor.
func (i *Interceptors) StreamServer() grpc.StreamServerInterceptor { return i.server.stream }

// DialOptions returns what a client connection needs in one go:
// grpc.WithDisableRetry, so that grpc-go's built-in retry cannot multiply
// stormguard's attempts underneath it (each of our attempts would be
// retried again, unseen by our budget, breaker and metadata), and the
// client interceptors. It turns off a retryPolicy of the service config;
// a retrying interceptor chained by other dial options
// (go-grpc-middleware's retry) stays on and multiplies attempts: remove
// it, and give stormguard the codes it retried that a retry can fix
// (WithCodes; not RESOURCE_EXHAUSTED, a quota).
func (i *Interceptors) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDisableRetry(),
		grpc.WithChainUnaryInterceptor(i.UnaryClient()),
		grpc.WithChainStreamInterceptor(i.StreamClient()),
	}
}

// ServerOptions returns the server options that install the server
// interceptors.
func (i *Interceptors) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(i.UnaryServer()),
		grpc.ChainStreamInterceptor(i.StreamServer()),
	}
}
