package interceptor

import "strings"

// normalizeTarget returns the key under which budgets, breakers and
// metrics know a client connection's target, so that the spellings of one
// address are one target: "dns:///payment:443", "dns://8.8.8.8/payment:443",
// "dns:payment:443", "passthrough:///payment:443" and "payment:443" are all
// "payment:443". Only the dns and passthrough schemes are removed (with
// the authority, which names a resolver, not the target); other schemes
// (unix, xds, custom resolvers) name other things and are kept. Host names
// are case-insensitive, so the result is lower case. It allocates only for
// a target with upper-case letters.
func normalizeTarget(target string) string {
	rest, ok := strings.CutPrefix(target, "dns:")
	if !ok {
		rest, ok = strings.CutPrefix(target, "passthrough:")
	}
	if ok {
		if r, found := strings.CutPrefix(rest, "//"); found {
			// "//authority/endpoint": drop the authority.
			if i := strings.IndexByte(r, '/'); i >= 0 {
				rest = r[i+1:]
			} else {
				rest = r
			}
		}
		if rest != "" {
			target = rest
		}
	}
	return strings.ToLower(target)
}
