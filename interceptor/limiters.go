package interceptor

import (
	"strconv"
	"strings"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/capped"
	"github.com/stormguard/stormguard/internal/keyed"
)

// maxLimiterKeys bounds a limiterSet, as breaker.DefaultMaxKeys bounds a
// breaker.Set: with WithPerMethodKeys, the keys are as many as the
// methods called, which a program does not always control.
const maxLimiterKeys = breaker.DefaultMaxKeys

// methodKey returns the key of the budget and breaker of a call to method
// of target with WithPerMethodKeys: "target method", or both quoted when
// that would be ambiguous. It is injective: an unquoted key holds exactly
// one space and never starts with a double quote (its target holds no
// space and does not start with one), while a quoted key starts with a
// double quote and strconv.QuotedPrefix finds where its target ends.
func methodKey(target, method string) string {
	if strings.IndexByte(target, ' ') < 0 && strings.IndexByte(method, ' ') < 0 && !strings.HasPrefix(target, `"`) {
		return target + " " + method
	}
	return strconv.Quote(target) + " " + strconv.Quote(method)
}

// methodKeys remembers the keys methodKey made, so that a call to a
// method called before makes none (a key made is a new string: an
// allocation on every call with WithPerMethodKeys), up to maxMethodKeys
// pairs; the calls of pairs past that make their key each time. The zero
// value is ready.
type methodKeys struct {
	m capped.Map[targetMethod, string]
}

// maxMethodKeys bounds methodKeys: the methods a process calls on its
// targets, as a rule far fewer.
const maxMethodKeys = 256

type targetMethod struct{ target, method string }

// key returns methodKey(target, method); a nil k makes it.
func (k *methodKeys) key(target, method string) string {
	if k == nil {
		return methodKey(target, method)
	}
	if key := k.m.Add(targetMethod{target, method}, maxMethodKeys, "", func() string { return methodKey(target, method) }); key != "" {
		return key
	}
	return methodKey(target, method)
}

// limiterSet holds one limiter per key, created on first use, at most max
// of them (see keyed.Map for which one a new key replaces), each wrapped
// once as the mechanism of the calls to its key.
type limiterSet struct {
	newLimiter func() (budget.Limiter, error)
	m          keyed.Map[*limiterGuard]
}

func newLimiterSet(newLimiter func() (budget.Limiter, error), maxKeys int) *limiterSet {
	s := &limiterSet{newLimiter: newLimiter}
	s.m.Max = maxKeys
	return s
}

func (s *limiterSet) get(key string) *limiterGuard {
	if g, ok := s.m.Load(key); ok {
		return g
	}
	l, err := s.newLimiter()
	if err != nil || l == nil {
		// The constructor succeeded in withLimiters with the same input,
		// so this is a custom limiter's bug: run without a limiter rather
		// than fail calls.
		return nil
	}
	return s.m.Get(key, func() *limiterGuard { return &limiterGuard{l} })
}

// len returns the number of limiters in the set.
func (s *limiterSet) len() int { return s.m.Len() }

// Range calls f for each key and limiter, for metrics.
func (s *limiterSet) Range(f func(key string, l budget.Limiter) bool) {
	s.m.Range(func(key string, g *limiterGuard) bool { return f(key, g.Limiter) })
}
