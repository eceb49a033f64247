// Package listeners is a copy-on-write list of callbacks, each under an
// optional key, for the state-change listeners of breaker.Set and
// adaptive.Set. Standard library only.
package listeners

import (
	"reflect"
	"sync"
	"sync/atomic"
)

// List holds functions of type F. Add is serialized; Each takes no lock,
// so the functions may call back into their owner. The zero List is
// empty and ready to use.
type List[F any] struct {
	mu sync.Mutex
	p  atomic.Pointer[[]entry[F]]
}

type entry[F any] struct {
	key   any
	keyed bool // key is comparable and not nil
	f     F
}

// Add adds f under key. Adding under a key already present replaces that
// function instead of adding a second, so that code that registers the
// same listener again (one per interceptor built from one set) has it
// called once. A nil key, or one that is not comparable (by its value:
// a struct holding a func in an interface field is not, though its type
// is), never matches: f is always added.
func (l *List[F]) Add(key any, f F) {
	keyed := key != nil && reflect.ValueOf(key).Comparable()
	l.mu.Lock()
	defer l.mu.Unlock()
	var next []entry[F]
	if old := l.p.Load(); old != nil {
		next = append(next, *old...)
	}
	for i, e := range next {
		if keyed && e.keyed && e.key == key {
			next[i].f = f
			l.p.Store(&next)
			return
		}
	}
	next = append(next, entry[F]{key: key, keyed: keyed, f: f})
	l.p.Store(&next)
}

// Each calls call with each function, in the order they were added.
func (l *List[F]) Each(call func(F)) {
	if es := l.p.Load(); es != nil {
		for _, e := range *es {
			call(e.f)
		}
	}
}
