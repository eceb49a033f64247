package interceptor

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
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

// limiterSet holds one limiter per key, created on first use, at most max
// of them. When it is full, a new key replaces a limiter chosen by a clock
// hand that gives limiters used since its last pass (or, for a new one,
// since their first call) a second chance, so the victim is one not used
// recently. The replaced limiter keeps working
// for calls that hold it; the next call for its key starts a fresh one.
type limiterSet struct {
	newLimiter func() (budget.Limiter, error)
	max        int
	m          sync.Map // string -> *limiterEntry

	mu   sync.Mutex // serializes inserts and evictions
	ring []*limiterEntry
	hand int
}

type limiterEntry struct {
	key  string
	l    budget.Limiter
	used atomic.Bool
}

func (s *limiterSet) get(key string) budget.Limiter {
	if v, ok := s.m.Load(key); ok {
		e := v.(*limiterEntry)
		if !e.used.Load() {
			e.used.Store(true)
		}
		return e.l
	}
	l, err := s.newLimiter()
	if err != nil || l == nil {
		// The constructor succeeded in withLimiters with the same input,
		// so this is a custom limiter's bug: run without a limiter rather
		// than fail calls.
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.m.Load(key); ok {
		return v.(*limiterEntry).l
	}
	// A new entry starts unused: it earns its second chance by a second
	// call. (Started used, a flood of new keys would leave every entry
	// used, and the hand would evict whatever it stands on, a hot key
	// included.)
	e := &limiterEntry{key: key, l: l}
	if len(s.ring) < max(s.max, 1) {
		s.ring = append(s.ring, e)
	} else {
		i := s.victim()
		s.m.Delete(s.ring[i].key)
		s.ring[i] = e
	}
	s.m.Store(key, e)
	return l
}

// victim returns the index in s.ring of the limiter to replace: the first
// under the hand not used since the hand last passed it. s.mu is held.
func (s *limiterSet) victim() int {
	n := len(s.ring)
	for range n {
		e := s.ring[s.hand]
		if !e.used.Load() {
			break
		}
		e.used.Store(false)
		s.hand = (s.hand + 1) % n
	}
	// After one round every used bit is clear, so the hand stops on the
	// entry where it started at the latest.
	i := s.hand
	s.hand = (s.hand + 1) % n
	return i
}

// len returns the number of limiters in the set.
func (s *limiterSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ring)
}

// Range calls f for each key and limiter, for metrics.
func (s *limiterSet) Range(f func(key string, l budget.Limiter) bool) {
	s.m.Range(func(k, v any) bool { return f(k.(string), v.(*limiterEntry).l) })
}
