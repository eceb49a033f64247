package interceptor

import (
	"fmt"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// TestLimiterSetBounded: with WithPerMethodKeys, 5 000 methods keep at
// most maxLimiterKeys limiters, and a limiter used all along survives.
func TestLimiterSetBounded(t *testing.T) {
	i := mustNew(t, noWait, WithPerMethodKeys(), WithLimiter(func() budget.Limiter { return &countLimiter{} }))
	cc := newCC(t)
	hot := "/svc/Hot"
	call := func(method string) {
		f := &fakeInvoker{results: []error{nil}}
		if err := i.UnaryClient()(ctxTimeout(t, time.Minute), method, nil, nil, cc, f.invoke); err != nil {
			t.Fatal(err)
		}
	}
	call(hot)
	first := i.client.cfg.limiters.get(methodKey(normalizeTarget(cc.Target()), hot))
	for n := range 5000 {
		call(fmt.Sprintf("/svc/M%d", n))
		call(hot)
	}
	if got := i.client.cfg.limiters.len(); got > maxLimiterKeys {
		t.Fatalf("limiters kept: got %d, want at most %d", got, maxLimiterKeys)
	}
	if got := i.client.cfg.limiters.get(methodKey(normalizeTarget(cc.Target()), hot)); got != first {
		t.Fatalf("the limiter of a method used all along was evicted")
	}
}

// TestMethodKeysRemembered: a per-method key made once is not made again
// (a key made is an allocation on every call), the remembered keys are
// methodKey's, and they stop at maxMethodKeys, past which the keys are
// still right.
func TestMethodKeysRemembered(t *testing.T) {
	var k methodKeys
	if got, want := k.key("payment:443", "/svc/M"), methodKey("payment:443", "/svc/M"); got != want {
		t.Fatalf("key %q, want %q", got, want)
	}
	if n := testing.AllocsPerRun(100, func() { _ = k.key("payment:443", "/svc/M") }); n != 0 {
		t.Errorf("a remembered key: %v allocations, want 0", n)
	}
	for n := range maxMethodKeys + 10 {
		m := fmt.Sprintf("/svc/M%d", n)
		if got, want := k.key("a b", m), methodKey("a b", m); got != want {
			t.Fatalf("key %q, want %q", got, want)
		}
	}
	if got := k.m.Len(); got != maxMethodKeys {
		t.Errorf("%d keys remembered, want %d", got, maxMethodKeys)
	}
	var none *methodKeys
	if got, want := none.key("payment:443", "/svc/M"), methodKey("payment:443", "/svc/M"); got != want {
		t.Errorf("nil: key %q, want %q", got, want)
	}
}

// TestMethodKeyUnambiguous: two different (target, method) pairs never
// share a key.
func TestMethodKeyUnambiguous(t *testing.T) {
	pairs := [][2]string{
		{"dns:///a", "/b/c"},
		{"dns:///a/b", "/c"},
		{"dns:///a/", "b/c"},
		{"a b", "/c"},
		{"a", "b /c"},
		{"a", " b /c"},
		{`"a"`, "/c"},
		{`a`, `"/c"`},
		{`"a" "/c"`, ""},
		{"", `"a" "/c"`},
		{"a", "/c"},
		{"", ""},
	}
	seen := map[string][2]string{}
	for _, p := range pairs {
		k := methodKey(p[0], p[1])
		if q, ok := seen[k]; ok {
			t.Fatalf("%q and %q share the key %q", p, q, k)
		}
		seen[k] = p
	}
	if got, want := methodKey("dns:///payment:443", "/pay.v1.Pay/Charge"), "dns:///payment:443 /pay.v1.Pay/Charge"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// countLimiter is a budget.Limiter that grants every retry.
type countLimiter struct{ requests int }

func (l *countLimiter) RecordRequest()            { l.requests++ }
func (l *countLimiter) TryRetry() bool            { return true }
func (l *countLimiter) RecordOutcome(bool)        {}
func (l *countLimiter) Snapshot() budget.Snapshot { return budget.Snapshot{} }
