package interceptor

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRecommended: the one-line configuration installs the throttle, the
// budget and admission control, and each call of Recommended gets state
// of its own.
func TestRecommended(t *testing.T) {
	a, err := New(Recommended()...)
	if err != nil {
		t.Fatalf("New(Recommended()...): %v", err)
	}
	b := mustNew(t, Recommended()...)
	switch {
	case a.client.cfg.throttles == nil:
		t.Error("no adaptive throttle")
	case a.client.cfg.limiters == nil:
		t.Error("no retry budget")
	case a.Admission() == nil:
		t.Error("no admission control")
	case a.client.cfg.breakers != nil:
		t.Error("a breaker, which Recommended leaves out")
	}
	if a.client.cfg.throttles == b.client.cfg.throttles || a.client.cfg.limiters == b.client.cfg.limiters || a.Admission() == b.Admission() {
		t.Error("two calls of Recommended share state")
	}
	// The parts cannot be given per call (each is refused, see
	// TestPerCallMisuseIsInternal).
	f := &fakeInvoker{results: []error{nil}}
	if err := a.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), f.invoke, Recommended()[0]); status.Code(err) != codes.Internal {
		t.Errorf("Recommended per call: got %v, want Internal", err)
	}
}
