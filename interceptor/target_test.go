package interceptor

import (
	"context"
	"testing"

	"github.com/stormguard/stormguard/breaker"
)

func TestNormalizeTarget(t *testing.T) {
	tests := []struct{ in, want string }{
		{"payment:443", "payment:443"},
		{"dns:///payment:443", "payment:443"},
		{"dns://8.8.8.8:53/payment:443", "payment:443"},
		{"dns:payment:443", "payment:443"},
		{"passthrough:///payment:443", "payment:443"},
		{"passthrough:payment:443", "payment:443"},
		{"DNS-Name.Example:443", "dns-name.example:443"},
		{"dns:///Payment.Svc:443", "payment.svc:443"},
		{"dns:///[::1]:50051", "[::1]:50051"},
		{"127.0.0.1:7003", "127.0.0.1:7003"},
		{"passthrough:///bufnet", "bufnet"},
		// Other schemes name other things: kept.
		{"unix:///tmp/payment.sock", "unix:///tmp/payment.sock"},
		{"xds:///payment", "xds:///payment"},
		// Degenerate input: never empty, never a panic.
		{"dns:///", "dns:///"},
		{"dns:", "dns:"},
		{"passthrough://", "passthrough://"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := normalizeTarget(tt.in); got != tt.want {
			t.Errorf("normalizeTarget(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestNormalizeTargetAllocs: the key is computed on every call, so the
// common spellings must not allocate.
func TestNormalizeTargetAllocs(t *testing.T) {
	for _, in := range []string{"dns:///payment:443", "passthrough:///payment:443", "payment:443"} {
		if n := testing.AllocsPerRun(100, func() { _ = normalizeTarget(in) }); n != 0 {
			t.Errorf("normalizeTarget(%q): %v allocations, want 0", in, n)
		}
	}
}

// TestTargetKeysNormalized: calls through "passthrough:///host:port",
// "dns:///host:port" and "host:port" share one breaker and report one
// target.
func TestTargetKeysNormalized(t *testing.T) {
	set := mustSet(t, breaker.Config{})
	var log targetLog
	i := mustNew(t, WithBreaker(set), WithObserver(&log))
	for _, target := range []string{"passthrough:///payment:443", "dns:///payment:443", "payment:443"} {
		var c call
		c.init(ctxTimeout(t, 10e9), &i.client.cfg, normalizeTarget(target), "/svc/M")
		c.observe(Event{Kind: EventRetryScheduled})
	}
	if got := set.Len(); got != 1 {
		t.Errorf("breakers in the set: got %d, want 1", got)
	}
	for _, tg := range log.targets {
		if tg != "payment:443" {
			t.Errorf("event target: got %q, want %q", tg, "payment:443")
		}
	}
	if len(log.targets) != 3 {
		t.Errorf("events: got %d, want 3", len(log.targets))
	}
}

// targetLog records the Target of every event.
type targetLog struct{ targets []string }

func (l *targetLog) Observe(_ context.Context, e Event) { l.targets = append(l.targets, e.Target) }
