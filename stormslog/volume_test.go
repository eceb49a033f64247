package stormslog_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/stormslog"
)

// record is one line a recorder received, stamped with the fake time.
type record struct {
	at    time.Duration // since the start of the outage
	msg   string
	attrs map[string]slog.Value
}

// recorder is a slog.Handler that keeps every line with the fake clock's
// time.
type recorder struct {
	clk   *clock.Fake
	start time.Time
	mu    sync.Mutex
	recs  []record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	attrs := map[string]slog.Value{}
	rec.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, record{r.clk.Now().Sub(r.start), rec.Message, attrs})
	return nil
}

// handlerStream makes a context look like a gRPC handler's.
type handlerStream struct{}

func (handlerStream) Method() string               { return "/p.S/Serve" }
func (handlerStream) SetHeader(metadata.MD) error  { return nil }
func (handlerStream) SendHeader(metadata.MD) error { return nil }
func (handlerStream) SetTrailer(metadata.MD) error { return nil }

// TestOutageLinesBounded: 8 users whose every call is refused for 3 s, one
// refusal per user per millisecond (24 000 refusals) over 3 targets, 3
// reasons, from handlers and from an edge client. Every target logs at
// most 2 lines per reason and in_handler value in each second, and the
// lines account for every refusal: the logged ones plus the repeats add
// up to 24 000, per key. The last interval's count is written by the first
// event after it, with no Flush.
func TestOutageLinesBounded(t *testing.T) {
	clk := clock.NewFake(frozen)
	rec := &recorder{clk: clk, start: frozen}
	o := stormslog.New(slog.New(rec), stormslog.WithClock(clk))
	handlerCtx := grpc.NewContextWithServerTransportStream(context.Background(), handlerStream{})
	targets := []string{"dns:///a", "dns:///b", "dns:///c"}
	reasons := []interceptor.StopReason{interceptor.StopAttempts, interceptor.StopPushback, interceptor.StopBudget}
	type key struct {
		target, reason string
		inHandler      bool
	}
	sent := map[key]int64{}
	const users, millis = 8, 3000
	for ms := range millis {
		for u := range users {
			ctx := context.Background()
			if u%2 == 0 {
				ctx = handlerCtx
			}
			tgt, r := targets[u%3], reasons[(ms+u)%3]
			o.Observe(ctx, interceptor.Event{Kind: interceptor.EventRetryRefused, Target: tgt, Method: "/p.S/M",
				Reason: r, Attempt: 1, Code: codes.Unavailable})
			sent[key{tgt, reasonLabel(r), u%2 == 0}]++
			// Other events in between, as traffic to healthy targets.
			o.Observe(ctx, interceptor.Event{Kind: interceptor.EventAttemptEnd, Target: "dns:///ok", Code: codes.OK})
		}
		clk.Advance(time.Millisecond)
	}
	clk.Advance(2 * time.Second)
	o.Observe(context.Background(), interceptor.Event{Kind: interceptor.EventAttemptEnd, Target: "dns:///ok"})
	n := len(rec.recs)
	o.Flush()
	if len(rec.recs) != n {
		t.Errorf("Flush wrote %d more lines, want none: the event after the last interval wrote them", len(rec.recs)-n)
	}

	got := map[key]int64{}
	perSecond := map[key]map[int64]int{}
	for _, r := range rec.recs {
		k := key{r.attrs["target"].String(), r.attrs["reason"].String(), r.attrs["in_handler"].Bool()}
		switch r.msg {
		case stormslog.MsgRetryRefused:
			got[k]++
		case stormslog.MsgRetryRefusedSummary:
			got[k] += r.attrs["repeats"].Int64()
		default:
			t.Fatalf("unexpected line %q", r.msg)
		}
		if perSecond[k] == nil {
			perSecond[k] = map[int64]int{}
		}
		perSecond[k][int64(r.at/time.Second)]++
	}
	for k, want := range sent {
		if got[k] != want {
			t.Errorf("%+v: lines account for %d refusals, want %d", k, got[k], want)
		}
	}
	if len(got) != len(sent) {
		t.Errorf("lines for %d keys, want %d", len(got), len(sent))
	}
	for k, secs := range perSecond {
		for s, lines := range secs {
			if lines > 2 {
				t.Errorf("%+v: %d lines in second %d, want at most 2", k, lines, s)
			}
		}
	}
	t.Logf("%d refusals, %d lines", users*millis, len(rec.recs))
}

// TestOutageChain: 8 users send 10 requests each through the chain while
// payment is down. Each tier logs its refusal once; Flush writes the other
// 79 as one count per tier. (Before, this was 240 lines.)
func TestOutageChain(t *testing.T) {
	var buf buffer
	c := startChain(t, newLogger(&buf, slog.LevelInfo), nil, nil)
	c.Tier("payment").SetDown(codes.Unavailable)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 {
				call(t, c, codes.Unavailable)
			}
		})
	}
	wg.Wait()
	c.flush()
	want := []string{
		refused("INFO", "order", "payment", "attempts", 3, 1),
		refused("INFO", "gateway", "order", "pushback", 1, 0),
		refused("INFO", "edge", "gateway", "pushback", 1, 0),
		repeats("INFO", "edge", "gateway", "pushback", 79),
		repeats("INFO", "gateway", "order", "pushback", 79),
		repeats("INFO", "order", "payment", "attempts", 79),
	}
	got := buf.lines()
	// The first lines come in the order the users' requests raced; the
	// repeats, written by Flush edge first, in a fixed order.
	if len(got) == len(want) {
		slices.Sort(got[:3])
		slices.Sort(want[:3])
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("log lines:\n got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func reasonLabel(r interceptor.StopReason) string {
	switch r {
	case interceptor.StopAttempts:
		return "attempts"
	case interceptor.StopPushback:
		return "pushback"
	case interceptor.StopBudget:
		return "budget"
	}
	return "other"
}

// TestIntervalZero: WithInterval(0) logs every refusal, one line each; a
// negative interval is ignored (the default applies).
func TestIntervalZero(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{{0, 5}, {-time.Second, 1}} {
		clk := clock.NewFake(frozen)
		rec := &recorder{clk: clk, start: frozen}
		o := stormslog.New(slog.New(rec), stormslog.WithClock(clk), stormslog.WithInterval(tc.d))
		for range 5 {
			o.Observe(context.Background(), interceptor.Event{Kind: interceptor.EventRetryRefused, Target: "t", Reason: interceptor.StopBudget})
		}
		if got := len(rec.recs); got != tc.want {
			t.Errorf("WithInterval(%v): got %d lines for 5 refusals, want %d", tc.d, got, tc.want)
		}
		o.Flush()
	}
}
