package interceptor

// MetadataEnvoyAttemptCount is the request header by which an Envoy proxy
// (a sidecar of Istio or another mesh) numbers its attempts to the
// upstream: 1 on the first, 2 on its first retry. Envoy sends it when the
// virtual host or route sets include_request_attempt_count. A value above
// 1 means the proxy between the caller and this tier is retrying, which
// the server counts as upstream retries (see WithEnvoyAttemptCount).
const MetadataEnvoyAttemptCount = "x-envoy-attempt-count"

// WithEnvoyAttemptCount sets whether the server interceptor counts the
// retries of an Envoy proxy in front of it, read from
// MetadataEnvoyAttemptCount, as upstream retries: a request with
// x-envoy-attempt-count: 3 has 2 more upstream retries, so that by the
// default tier policy this tier does not retry it again. Default true. It
// is ignored with WithUntrustedCallers, where all incoming attempt
// metadata is. Server side.
func WithEnvoyAttemptCount(on bool) Option {
	return setupOption("WithEnvoyAttemptCount", func(c *config) error {
		c.ignoreEnvoy = !on
		return nil
	})
}

// addEnvoyRetries adds the retries of an Envoy proxy, from its attempt
// count, to the upstream retries of in. The count is parsed like the other
// attempt metadata: repeated values give the largest, values are clamped,
// and a malformed value counts as a retry (an attempt count of 2), so
// that no value yields more attempts here than an honest one. A count of
// 0 or 1, or none, adds nothing.
func addEnvoyRetries(in Info, get func(key string) []string) Info {
	count := cautious(get(MetadataEnvoyAttemptCount), MaxAttemptIndex+1, 2)
	if count > 1 {
		in.UpstreamRetries = min(in.UpstreamRetries+count-1, MaxUpstreamRetries)
	}
	return in
}
