package stormslog_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
	"github.com/stormguard/stormguard/stormslog"
)

// The chain tests start gRPC servers and clients.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var fast = interceptor.WithBackoff(interceptor.Backoff{Base: time.Microsecond, Cap: time.Microsecond})

// buffer collects the log output of every process.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := strings.TrimSuffix(b.b.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// newLogger returns a JSON logger at level into buf, without the time, and
// with the retry delay (random below the 1µs cap) replaced by "d".
func newLogger(buf *buffer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: level, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		switch {
		case len(groups) == 0 && a.Key == slog.TimeKey:
			return slog.Attr{}
		case a.Key == "delay":
			if d := a.Value.Duration(); d < 0 || d > time.Microsecond {
				return slog.String("delay", "out of range: "+d.String())
			}
			return slog.String("delay", "d")
		}
		return a
	}}))
}

// frozen is the time of the observers' fake clocks.
var frozen = time.Unix(1_000_000, 0)

// chain is a running chain and the Observer of each process.
type chain struct {
	*testsvc.Chain
	obs map[string]*stormslog.Observer
}

// startChain runs gateway -> order -> payment with stormguard on every hop
// and an Observer per process ("edge", "gateway", "order", "payment"),
// logging with a proc attribute, on clk (a frozen fake clock if nil).
// opts adds client options per process.
func startChain(t *testing.T, l *slog.Logger, clk *clock.Fake, opts func(proc string, o interceptor.Observer) []interceptor.Option) *chain {
	t.Helper()
	if clk == nil {
		clk = clock.NewFake(frozen)
	}
	names := append([]string{"edge"}, testsvc.DefaultTiers...)
	ics := map[string]*interceptor.Interceptors{}
	obs := map[string]*stormslog.Observer{}
	for _, name := range names {
		o := stormslog.New(l.With("proc", name), stormslog.WithClock(clk))
		obs[name] = o
		all := []interceptor.Option{fast, interceptor.WithObserver(o)}
		if opts != nil {
			all = append(all, opts(name, o)...)
		}
		ic, err := interceptor.New(all...)
		if err != nil {
			t.Fatal(err)
		}
		ics[name] = ic
	}
	c := testsvc.New(t, testsvc.Config{
		DialOptions:   func(hop int) []grpc.DialOption { return ics[names[hop]].DialOptions() },
		ServerOptions: func(tier int) []grpc.ServerOption { return ics[names[tier+1]].ServerOptions() },
	})
	return &chain{c, obs}
}

// flush flushes the observers, edge first.
func (c *chain) flush() {
	for _, name := range append([]string{"edge"}, testsvc.DefaultTiers...) {
		c.obs[name].Flush()
	}
}

func call(t *testing.T, c *chain, want codes.Code) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Client().Unary(ctx, &testsvcv1.UnaryRequest{})
	if got := status.Code(err); got != want {
		t.Fatalf("user got %v, want %v", err, want)
	}
}

func checkLines(t *testing.T, buf *buffer, want []string) {
	t.Helper()
	got := buf.lines()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("log lines:\n got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

const unary = `"method":"/stormguard.testsvc.v1.TestService/Unary"`

// refused is the line of a refusal; every refusal in these scenarios is of
// an UNAVAILABLE failure (or, for an open breaker's first attempt, the
// UNAVAILABLE the caller gets). Every process but the edge calls from a
// handler.
func refused(level, proc, target, reason string, attempt, depth int) string {
	return `{"level":"` + level + `","msg":"stormguard: retry refused","proc":"` + proc +
		`","target":"` + target + `",` + unary + `,"reason":"` + reason +
		`","attempt":` + itoa(attempt) + `,"depth":` + itoa(depth) + `,"in_handler":` + inHandler(proc) + `,"code":"Unavailable"}`
}

// repeats is the summary line of n more refusals over one second.
func repeats(level, proc, target, reason string, n int) string {
	return `{"level":"` + level + `","msg":"stormguard: retry refused, repeats","proc":"` + proc +
		`","target":"` + target + `","reason":"` + reason + `","in_handler":` + inHandler(proc) +
		`,"repeats":` + strconv.Itoa(n) + `,"interval":1000000000}`
}

func inHandler(proc string) string { return strconv.FormatBool(proc != "edge") }

func itoa(n int) string { return string(rune('0' + n)) } // single digits

// The operator's view of one request with payment down, at the default
// INFO level: order used its attempts; gateway and the edge were told not
// to retry. One line per tier, innermost first.
func TestPaymentDownOneRequest(t *testing.T) {
	var buf buffer
	c := startChain(t, newLogger(&buf, slog.LevelInfo), nil, nil)
	c.Tier("payment").SetDown(codes.Unavailable)
	call(t, c, codes.Unavailable)
	checkLines(t, &buf, []string{
		refused("INFO", "order", "payment", "attempts", 3, 1),
		refused("INFO", "gateway", "order", "pushback", 1, 0),
		refused("INFO", "edge", "gateway", "pushback", 1, 0),
	})
}

// At DEBUG, the scheduled retries and the pushbacks appear too.
func TestPaymentDownDebug(t *testing.T) {
	var buf buffer
	c := startChain(t, newLogger(&buf, slog.LevelDebug), nil, nil)
	c.Tier("payment").SetDown(codes.Unavailable)
	call(t, c, codes.Unavailable)
	scheduled := func(attempt int) string {
		return `{"level":"DEBUG","msg":"stormguard: retry scheduled","proc":"order","target":"payment",` +
			unary + `,"attempt":` + itoa(attempt) + `,"depth":1,"in_handler":true,"delay":"d"}`
	}
	pushback := func(proc string, depth int) string {
		return `{"level":"DEBUG","msg":"stormguard: pushback sent","proc":"` + proc + `",` + unary +
			`,"depth":` + itoa(depth) + `,"attempt":0,"code":"Unavailable"}`
	}
	checkLines(t, &buf, []string{
		scheduled(1),
		scheduled(2),
		refused("INFO", "order", "payment", "attempts", 3, 1),
		pushback("order", 1),
		refused("INFO", "gateway", "order", "pushback", 1, 0),
		pushback("gateway", 0),
		refused("INFO", "edge", "gateway", "pushback", 1, 0),
	})
}

// Successful calls log nothing, even at DEBUG.
func TestSuccessIsSilent(t *testing.T) {
	var buf buffer
	c := startChain(t, newLogger(&buf, slog.LevelDebug), nil, nil)
	for range 10 {
		call(t, c, codes.OK)
	}
	checkLines(t, &buf, nil)
}

// A WARN-level logger shows only the budget's refusals: with a budget of
// 0.5 retries per request without floor on a frozen clock, order's budget
// refuses the second retry of request 1, the first of request 2, the
// second of request 3 and the first of request 4 (see
// stormotel.TestBudgetRefusals). The first is logged, the other three are
// counted, and Flush writes their count.
func TestBudgetRefusalsAtWarn(t *testing.T) {
	var buf buffer
	c := startChain(t, newLogger(&buf, slog.LevelWarn), nil, func(string, interceptor.Observer) []interceptor.Option {
		return []interceptor.Option{interceptor.WithBudget(budget.Config{
			Ratio: 0.5, NoFloor: true, Clock: clock.NewFake(frozen),
		})}
	})
	c.Tier("payment").SetDown(codes.Unavailable)
	for range 4 {
		call(t, c, codes.Unavailable)
	}
	checkLines(t, &buf, []string{
		refused("WARN", "order", "payment", "budget", 2, 1),
	})
	c.flush()
	checkLines(t, &buf, []string{
		refused("WARN", "order", "payment", "budget", 2, 1),
		repeats("WARN", "order", "payment", "budget", 3),
	})
}

// The breaker at order opens after 3 failures in a row (WARN), refuses the
// next request outright (WARN), and after the open interval on the fake
// clock, with payment back, goes half-open and closed (INFO). The breaker
// Set has no OnStateChange: interceptor.New wires the observer into it.
// The second request's pushbacks at gateway and the edge repeat the
// first's within the second: they are summed up at the first event after
// it.
func TestBreakerLines(t *testing.T) {
	for _, tc := range []struct {
		name     string
		onChange func(o interceptor.Observer, user *atomic.Int64) func(string, breaker.State, breaker.State)
		user     int64 // changes the user's own OnStateChange sees
	}{
		{"wired by New", func(interceptor.Observer, *atomic.Int64) func(string, breaker.State, breaker.State) { return nil }, 0},
		// Another observer in the config (metrics, say) does not keep
		// New from reporting to its own (review: a BreakerObserver of any
		// observer in the config used to switch New's wiring off).
		{"BreakerObserver of another observer in the config", func(_ interceptor.Observer, user *atomic.Int64) func(string, breaker.State, breaker.State) {
			return interceptor.BreakerObserver(countingObserver{user})
		}, 3},
		// A callback of the user's own keeps working next to the observer.
		{"user callback", func(_ interceptor.Observer, user *atomic.Int64) func(string, breaker.State, breaker.State) {
			return func(string, breaker.State, breaker.State) { user.Add(1) }
		}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf buffer
			var user atomic.Int64
			fc := clock.NewFake(frozen)
			c := startChain(t, newLogger(&buf, slog.LevelInfo), fc, func(proc string, o interceptor.Observer) []interceptor.Option {
				if proc != "order" {
					return nil
				}
				set, err := breaker.NewSet(breaker.Config{
					ConsecutiveFailures: 3, OpenInterval: time.Second, Jitter: breaker.NoJitter, HalfOpenProbes: 1,
					Clock: fc, OnStateChange: tc.onChange(o, &user),
				}, 0)
				if err != nil {
					t.Fatal(err)
				}
				return []interceptor.Option{interceptor.WithBreaker(set)}
			})
			pay := c.Tier("payment")
			pay.SetDown(codes.Unavailable)
			call(t, c, codes.Unavailable)
			call(t, c, codes.Unavailable)
			pay.SetUp()
			fc.Advance(time.Second)
			call(t, c, codes.OK)
			change := func(level, from, to string) string {
				return `{"level":"` + level + `","msg":"stormguard: circuit breaker state changed","proc":"order",` +
					`"target":"payment","from":"` + from + `","to":"` + to + `"}`
			}
			checkLines(t, &buf, []string{
				change("WARN", "closed", "open"),
				refused("INFO", "order", "payment", "attempts", 3, 1),
				refused("INFO", "gateway", "order", "pushback", 1, 0),
				refused("INFO", "edge", "gateway", "pushback", 1, 0),
				refused("WARN", "order", "payment", "breaker_open", 0, 1),
				repeats("INFO", "edge", "gateway", "pushback", 1),
				repeats("INFO", "gateway", "order", "pushback", 1),
				change("INFO", "open", "half-open"),
				change("INFO", "half-open", "closed"),
			})
			if got := user.Load(); got != tc.user {
				t.Errorf("the user's OnStateChange saw %d changes, want %d", got, tc.user)
			}
		})
	}
}

// WithLevel moves a reason to another level; events the package does not
// log stay silent.
func TestWithLevel(t *testing.T) {
	var buf buffer
	o := stormslog.New(newLogger(&buf, slog.LevelInfo), stormslog.WithLevel(interceptor.StopAttempts, slog.LevelDebug),
		stormslog.WithLevel(interceptor.StopPushback, slog.LevelError))
	ctx := context.Background()
	for _, e := range []interceptor.Event{
		{Kind: interceptor.EventRetryRefused, Target: "t", Method: "/p.S/M", Reason: interceptor.StopAttempts, Attempt: 3},
		{Kind: interceptor.EventRetryRefused, Target: "t", Method: "/p.S/M", Reason: interceptor.StopPushback, Attempt: 1, Code: codes.Unavailable},
		{Kind: interceptor.EventAttemptStart, Target: "t", Method: "/p.S/M"},
		{Kind: interceptor.EventAttemptEnd, Target: "t", Method: "/p.S/M", Code: codes.Unavailable},
		{Kind: interceptor.EventRequestReceived, Method: "/p.S/M"},
	} {
		o.Observe(ctx, e)
	}
	checkLines(t, &buf, []string{
		`{"level":"ERROR","msg":"stormguard: retry refused","target":"t","method":"/p.S/M","reason":"pushback","attempt":1,"depth":0,"in_handler":false,"code":"Unavailable"}`,
	})
}

// BenchmarkObserve: a refusal written as JSON, and an attempt's end, which
// is never logged. Neither allocates in the Observer.
func BenchmarkObserve(b *testing.B) {
	o := stormslog.New(slog.New(slog.NewJSONHandler(io.Discard, nil)))
	ctx := context.Background()
	for _, e := range []interceptor.Event{
		{Kind: interceptor.EventRetryRefused, Target: "dns:///payment", Method: "/p.S/M", Reason: interceptor.StopBudget, Attempt: 1},
		{Kind: interceptor.EventAttemptEnd, Target: "dns:///payment", Method: "/p.S/M", Code: codes.Unavailable},
	} {
		b.Run(e.Kind.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					o.Observe(ctx, e)
				}
			})
		})
	}
}

// countingObserver counts the events it sees.
type countingObserver struct{ n *atomic.Int64 }

func (c countingObserver) Observe(context.Context, interceptor.Event) { c.n.Add(1) }

// At slog's WARN level, as production loggers often run, the adaptive
// throttle at work is seen: its refusals, a target it marks down (and,
// at INFO, back up); a caller whose attempts multiply is logged once per
// method. (From the review of 2026-12-05: Recommended relies on the
// throttle, whose refusals were INFO and whose changes were not logged.)
func TestThrottleAndStackedLines(t *testing.T) {
	buf := &buffer{}
	o := stormslog.New(newLogger(buf, slog.LevelWarn), stormslog.WithClock(clock.NewFake(frozen)))
	ctx := context.Background()
	o.Observe(ctx, interceptor.Event{Kind: interceptor.EventRetryRefused, Target: "payment", Method: "/p.S/M", Reason: interceptor.StopThrottled, Attempt: 1, Code: codes.Unavailable})
	o.Observe(ctx, interceptor.Event{Kind: interceptor.EventTargetDown, Target: "payment"})
	o.Observe(ctx, interceptor.Event{Kind: interceptor.EventTargetUp, Target: "payment"}) // INFO: not at WARN
	for range 3 {
		o.Observe(ctx, interceptor.Event{Kind: interceptor.EventStackedRetry, Method: "/p.S/M", Info: interceptor.Info{Depth: 1, Attempt: 1}})
	}
	o.Observe(ctx, interceptor.Event{Kind: interceptor.EventStackedRetry, Method: "/p.S/N"})
	want := []string{
		`{"level":"WARN","msg":"stormguard: retry refused","target":"payment","method":"/p.S/M","reason":"throttled","attempt":1,"depth":0,"in_handler":false,"code":"Unavailable"}`,
		`{"level":"WARN","msg":"stormguard: target down","target":"payment"}`,
		`{"level":"WARN","msg":"stormguard: stacked retries","method":"/p.S/M","depth":1,"attempt":1}`,
		`{"level":"WARN","msg":"stormguard: stacked retries","method":"/p.S/N","depth":0,"attempt":0}`,
	}
	if got := buf.lines(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	buf2 := &buffer{}
	o = stormslog.New(newLogger(buf2, slog.LevelInfo))
	o.Observe(ctx, interceptor.Event{Kind: interceptor.EventTargetUp, Target: "payment"})
	if got, want := buf2.lines(), []string{`{"level":"INFO","msg":"stormguard: target back up","target":"payment"}`}; strings.Join(got, "") != want[0] {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// A server's admission refusals and health changes are logged as the
// client's refusals are: the first of an interval as it happens, the
// others of it as one summary line (for health, naming the state the
// last change entered). (An operator's trial: an overloaded
// server that refused half its traffic, and a server that said
// NOT_SERVING, logged nothing.)
func TestAdmissionAndHealthLines(t *testing.T) {
	buf := &buffer{}
	clk := clock.NewFake(frozen)
	o := stormslog.New(newLogger(buf, slog.LevelInfo), stormslog.WithClock(clk))
	ctx := context.Background()
	for range 100 {
		o.Observe(ctx, interceptor.Event{Kind: interceptor.EventAdmissionRefused, Method: "/p.S/M", Admission: interceptor.AdmissionOverload, Code: codes.Unavailable, Info: interceptor.Info{Attempt: 1}})
	}
	o.Observe(ctx, interceptor.Event{Kind: interceptor.EventAdmissionRefused, Method: "/p.S/M", Admission: interceptor.AdmissionCallerGone, Code: codes.Canceled})
	for range 5 { // trials that fail: NOT_SERVING, SERVING, NOT_SERVING, ...
		o.Observe(ctx, interceptor.Event{Kind: interceptor.EventNotServing})
		o.Observe(ctx, interceptor.Event{Kind: interceptor.EventServing})
	}
	clk.Advance(2 * time.Second)
	o.Flush()
	want := []string{
		`{"level":"WARN","msg":"stormguard: request refused","method":"/p.S/M","reason":"overload","code":"Unavailable","attempt":1}`,
		`{"level":"INFO","msg":"stormguard: request refused","method":"/p.S/M","reason":"caller_gone","code":"Canceled","attempt":0}`,
		`{"level":"WARN","msg":"stormguard: not serving"}`,
		`{"level":"WARN","msg":"stormguard: request refused, repeats","reason":"overload","repeats":99,"interval":1000000000}`,
		`{"level":"INFO","msg":"stormguard: health changes, repeats","to":"SERVING","repeats":9,"interval":1000000000}`,
	}
	if got := buf.lines(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A SERVING is a trial's start (a server that is not serving lets one in
// every 200 ms): logged as "serving on trial", not as a recovery. Read as
// "serving again", the first change of each second of an outage told an
// on-call that the server had recovered (a user's trial).
func TestServingIsLoggedAsTrial(t *testing.T) {
	buf := &buffer{}
	o := stormslog.New(newLogger(buf, slog.LevelInfo), stormslog.WithClock(clock.NewFake(frozen)))
	o.Observe(context.Background(), interceptor.Event{Kind: interceptor.EventServing})
	want := `{"level":"INFO","msg":"stormguard: serving on trial"}`
	if got := buf.lines(); len(got) != 1 || got[0] != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
