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
// first invalid option and wraps ErrInvalidOption.
func New(opts ...Option) (*Interceptors, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return &Interceptors{client: client{cfg: cfg}, server: server{untrusted: cfg.untrusted, observer: cfg.observer, retryable: cfg.retryable, admission: cfg.admission}}, nil
}

// UnaryClient returns the unary client interceptor.
func (i *Interceptors) UnaryClient() grpc.UnaryClientInterceptor { return i.client.unary }

// UnaryServer returns the unary server interceptor.
func (i *Interceptors) UnaryServer() grpc.UnaryServerInterceptor { return i.server.unary }

// StreamClient returns the stream client interceptor.
func (i *Interceptors) StreamClient() grpc.StreamClientInterceptor { return i.client.stream }

// StreamServer returns the stream server interceptor.
func (i *Interceptors) StreamServer() grpc.StreamServerInterceptor { return i.server.stream }

// DialOptions returns what a client connection needs in one go:
// grpc.WithDisableRetry, so that grpc-go's built-in retry cannot multiply
// stormguard's attempts underneath it (each of our attempts would be
// retried again, unseen by our budget, breaker and metadata), and the
// client interceptors.
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
