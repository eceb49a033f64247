package interceptor

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// countMech counts what a mechanism hears: allows, and dones per attempt.
type countMech struct {
	refuseFrom int // refuse attempts with index >= refuseFrom (0: never)
	panicDone  bool
	allowed    int
	outs       []outcome
	dones      int
}

func (m *countMech) allow(c *call, a *attempt) StopReason {
	if m.refuseFrom > 0 && int(a.n) >= m.refuseFrom {
		return StopThrottled
	}
	m.allowed++
	return 0
}

func (m *countMech) done(c *call, a *attempt, o outcome) {
	m.dones++
	m.outs = append(m.outs, o)
	if m.panicDone {
		m.panicDone = false
		panic("done boom")
	}
}

func (m *countMech) retry(*call) StopReason { return 0 }

// panicStatusErr is an error whose GRPCStatus panics: a panic after the
// invoker returned, in ownTimeout/classify.
type panicStatusErr struct{}

func (panicStatusErr) Error() string              { return "bad" }
func (panicStatusErr) GRPCStatus() *status.Status { panic("status boom") }

func withMech(t *testing.T, m *countMech, opts ...Option) *Interceptors {
	i := mustNew(t, append([]Option{noWait, WithMaxAttempts(3), WithPerAttemptTimeout(time.Minute)}, opts...)...)
	i.client.cfg.mechanisms = append(i.client.cfg.mechanisms, func(string) mechanism { return m })
	return i
}

// TestUnaryReportsEveryAttemptOnce: on every way out of the unary loop, each
// allowed attempt is reported exactly once, none that was refused is,
// and every attempt's context is cancelled.
func TestUnaryReportsEveryAttemptOnce(t *testing.T) {
	type tc struct {
		name       string
		results    []any // error, or a value to panic with
		mech       countMech
		wantAllow  int
		wantPanic  bool
		wantLastPk bool // the last report is `panicked`
	}
	for _, c := range []tc{
		{name: "success", results: []any{nil}, wantAllow: 1},
		{name: "retried then success", results: []any{errUnavailable, nil}, wantAllow: 2},
		{name: "attempts used up", results: []any{errUnavailable}, wantAllow: 3},
		{name: "refused retry", results: []any{errUnavailable}, mech: countMech{refuseFrom: 1}, wantAllow: 1},
		{name: "invoker panics", results: []any{"invoker boom"}, wantAllow: 1, wantPanic: true, wantLastPk: true},
		{name: "invoker panics on retry", results: []any{errUnavailable, "invoker boom"}, wantAllow: 2, wantPanic: true, wantLastPk: true},
		{name: "classify panics", results: []any{panicStatusErr{}}, wantAllow: 1, wantPanic: true, wantLastPk: true},
		{name: "done panics", results: []any{nil}, mech: countMech{panicDone: true}, wantAllow: 1, wantPanic: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := c.mech
			i := withMech(t, &m)
			var ctxs []context.Context
			invoker := func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				ctxs = append(ctxs, ctx)
				r := c.results[min(len(ctxs)-1, len(c.results)-1)]
				switch r := r.(type) {
				case nil:
					return nil
				case error:
					return r
				default:
					panic(r)
				}
			}
			_, panicked := recovering(func() error {
				return i.UnaryClient()(ctxTimeout(t, time.Minute), "/svc/M", nil, nil, newCC(t), invoker)
			})
			if panicked != c.wantPanic {
				t.Fatalf("panicked %v, want %v", panicked, c.wantPanic)
			}
			if m.allowed != c.wantAllow || len(ctxs) != c.wantAllow {
				t.Fatalf("allowed %d, invoked %d; want %d", m.allowed, len(ctxs), c.wantAllow)
			}
			if m.dones != m.allowed {
				t.Fatalf("%d reports for %d allowed attempts: %+v", m.dones, m.allowed, m.outs)
			}
			if c.wantLastPk && m.outs[len(m.outs)-1] != panicked_ {
				t.Fatalf("last report %+v, want panicked", m.outs[len(m.outs)-1])
			}
			for n, ctx := range ctxs {
				if ctx.Err() == nil {
					t.Fatalf("attempt %d's context not cancelled", n)
				}
			}
		})
	}
}

var panicked_ = panicked

// TestServerDonePanicReportsOnce: a server mechanism whose done
// panics after the handler returned is not told a second time
// (errPanicked) by leftOnPanic.
func TestServerDonePanicReportsOnce(t *testing.T) {
	m := &countServerMech{panicDone: true}
	s := &server{retryable: codeBit(codes.Unavailable), mechs: []serverMechanism{m}}
	_, panicked := recovering(func() error {
		_, err := s.unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/svc/M"}, func(context.Context, any) (any, error) {
			return nil, nil
		})
		return err
	})
	if !panicked || len(m.errs) != 1 || m.errs[0] != nil {
		t.Fatalf("panicked %v, done heard %v; want true and [nil]", panicked, m.errs)
	}
	// A handler that panics: done hears errPanicked once.
	m = &countServerMech{}
	s.mechs = []serverMechanism{m}
	_, panicked = recovering(func() error {
		_, err := s.unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/svc/M"}, func(context.Context, any) (any, error) {
			panic("handler boom")
		})
		return err
	})
	if !panicked || len(m.errs) != 1 || m.errs[0] != errPanicked {
		t.Fatalf("panicked %v, done heard %v; want true and [errPanicked]", panicked, m.errs)
	}
	// Refused: done hears nothing from this mechanism (it refused), handler not run.
	m = &countServerMech{refuse: true}
	s.mechs = []serverMechanism{m}
	ran := false
	_, err := s.unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/svc/M"}, func(context.Context, any) (any, error) {
		ran = true
		return nil, nil
	})
	if err == nil || ran || len(m.errs) != 0 {
		t.Fatalf("refused: err %v, ran %v, done heard %v", err, ran, m.errs)
	}
}

type countServerMech struct {
	panicDone, refuse bool
	errs              []error
}

func (m *countServerMech) admit(*server, *stateCtx, string, grpc.ServerStream) error {
	if m.refuse {
		return status.Error(codes.Unavailable, "refused")
	}
	return nil
}

func (m *countServerMech) done(_ *server, _ *stateCtx, err error) {
	m.errs = append(m.errs, err)
	if m.panicDone {
		m.panicDone = false
		panic("server done boom")
	}
}

// deadlinePanicCtx is a caller context whose Deadline panics once the
// attempt's context is made (context.WithTimeout asks the parent), i.e.
// a panic in attemptContext, after the mechanisms allowed the attempt.
type deadlinePanicCtx struct {
	context.Context
	armed *bool
}

func (c deadlinePanicCtx) Deadline() (time.Time, bool) {
	if *c.armed {
		panic("deadline boom")
	}
	return c.Context.Deadline()
}

// TestAttemptContextPanic: a panic while the attempt's context is
// made (attemptContext) must still report the allowed attempt, and must
// pass on the original panic value.
func TestAttemptContextPanic(t *testing.T) {
	m := &countMech{}
	i := withMech(t, m)
	armed := false
	ctx := deadlinePanicCtx{Context: context.Background(), armed: &armed}
	cc := newCC(t)
	var got any
	func() {
		defer func() { got = recover() }()
		// Arm only once the mechanisms were asked.
		i.client.cfg.mechanisms = append(i.client.cfg.mechanisms, func(string) mechanism { return armMech{&armed} })
		_ = i.UnaryClient()(ctx, "/svc/M", nil, nil, cc, func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			return nil
		})
	}()
	if got != "deadline boom" {
		t.Errorf("the panic that reached the caller: %v, want \"deadline boom\"", got)
	}
	if m.dones != m.allowed {
		t.Errorf("%d reports for %d allowed attempts", m.dones, m.allowed)
	}
}

type armMech struct{ armed *bool }

func (a armMech) allow(*call, *attempt) StopReason { *a.armed = true; return 0 }
func (a armMech) done(*call, *attempt, outcome)    {}
func (a armMech) retry(*call) StopReason           { return 0 }
