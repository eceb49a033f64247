package busy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/testsvc"
)

func TestWorkArgsRoundTrip(t *testing.T) {
	for _, w := range []Work{
		{},
		{FailAll: true},
		{Fail: 0.01, Wait: 30 * time.Millisecond},
		{Workers: 4, Hold: 5 * time.Millisecond, CPU: 1234},
		{Workers: 16, Hold: 50 * time.Millisecond, Spread: true},
		{Wait: 100 * time.Millisecond, Spread: true},
		{Wait: 4500 * time.Microsecond, Slow: 0.25, SlowWait: 200 * time.Millisecond},
		{Wait: 4500 * time.Microsecond, SlowWait: 200 * time.Millisecond},
	} {
		f, err := parseTierFlags(append([]string{"--tier", "payment"}, w.Args()...), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%+v: %v", w, err)
		}
		if f.work != w {
			t.Errorf("flags of %+v parsed as %+v", w, f.work)
		}
	}
}

func TestTierFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tier", "db"}, "want one of"},
		{[]string{"--tier", "order"}, "needs --next"},
		{[]string{"--tier", "payment", "--next", "127.0.0.1:1"}, "takes no --next"},
		{[]string{"--tier", "payment", "--fail", "2"}, "probability"},
		{[]string{"--tier", "payment", "--fail", "NaN"}, "probability"},
		{[]string{"--tier", "payment", "--workers", "4"}, "needs both"},
		{[]string{"--tier", "payment", "--wait", "-1s"}, ">= 0"},
		{[]string{"--tier", "payment", "--cpu", "1ms", "--cpu-units", "5"}, "give one"},
		{[]string{"--tier", "payment", "--slow", "1.5"}, "share in [0, 1]"},
		{[]string{"--tier", "payment", "--slow", "NaN"}, "share in [0, 1]"},
		{[]string{"--tier", "payment", "--slow-wait", "-1s"}, ">= 0"},
		{[]string{"--tier", "payment", "--listen", "0.0.0.0:0"}, "loopback"},
		{[]string{"--tier", "order", "--next", "10.0.0.1:80"}, "loopback"},
		{[]string{"--tier", "payment", "extra"}, "unexpected argument"},
		{[]string{"--tier", "payment", "--bogus"}, "not defined"},
	} {
		_, err := parseTierFlags(tc.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
	// ServeTier reports a bad stack before it listens.
	err := ServeTier(context.Background(), []string{"--tier", "payment", "--stack", "nope"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "want one of") {
		t.Errorf("unknown stack: got %v", err)
	}
}

// Spread draws each request's wait and hold from exponential
// distributions of their means; without it every request takes them.
func TestWorkerSpread(t *testing.T) {
	const wait, hold, n = 100 * time.Millisecond, 20 * time.Millisecond, 20000
	k := newWorker(Work{Wait: wait, Workers: 4, Hold: hold, Spread: true}, 3)
	var sumW, sumH time.Duration
	over := 0 // waits beyond three means: 5 % of an exponential's
	for range n {
		w, h := k.times()
		sumW, sumH = sumW+w, sumH+h
		if w > 3*wait {
			over++
		}
	}
	if m := sumW / n; m < 95*time.Millisecond || m > 105*time.Millisecond {
		t.Errorf("mean wait %v, want about %v", m, wait)
	}
	if m := sumH / n; m < 19*time.Millisecond || m > 21*time.Millisecond {
		t.Errorf("mean hold %v, want about %v", m, hold)
	}
	if share := float64(over) / n; share < 0.04 || share > 0.06 {
		t.Errorf("%.3f of the waits beyond three means, want about 0.05 (exponential)", share)
	}
	if w, h := newWorker(Work{Wait: wait, Workers: 4, Hold: hold}, 3).times(); w != wait || h != hold {
		t.Errorf("without Spread: %v and %v, want %v and %v", w, h, wait, hold)
	}
}

// Slow makes its share of requests wait about SlowWait (half to one
// and a half times it) instead of Wait; setSlow switches the share.
func TestWorkerSlow(t *testing.T) {
	const wait, slowWait, n = 4 * time.Millisecond, 200 * time.Millisecond, 20000
	k := newWorker(Work{Wait: wait, SlowWait: slowWait}, 3)
	if w, _ := k.times(); w != wait {
		t.Errorf("no slow share: waited %v, want %v", w, wait)
	}
	k.setSlow(0.25)
	slow := 0
	for range n {
		switch w, _ := k.times(); {
		case w == wait:
		case w >= slowWait/2 && w <= 3*slowWait/2:
			slow++
		default:
			t.Fatalf("waited %v, want %v or within [%v, %v]", w, wait, slowWait/2, 3*slowWait/2)
		}
	}
	if share := float64(slow) / n; share < 0.24 || share > 0.26 {
		t.Errorf("%.3f of the requests slow, want about 0.25", share)
	}
	k.setSlow(0)
	if w, _ := k.times(); w != wait {
		t.Errorf("slow share switched off: waited %v, want %v", w, wait)
	}
}

func TestWorkerFailures(t *testing.T) {
	ctx := context.Background()
	if err := newWorker(Work{FailAll: true}, 1).do(ctx); status.Code(err) != codes.Unavailable {
		t.Errorf("FailAll: got %v, want Unavailable", err)
	}
	if err := newWorker(Work{Fail: 1}, 1).do(ctx); status.Code(err) != codes.Unavailable {
		t.Errorf("Fail 1: got %v, want Unavailable", err)
	}
	k := newWorker(Work{Fail: 0.5}, 7)
	failed := 0
	for range 1000 {
		if k.do(ctx) != nil {
			failed++
		}
	}
	if failed < 400 || failed > 600 {
		t.Errorf("Fail 0.5: %d of 1000 failed", failed)
	}
}

// TestWorkerPoolWaitEndsWithCaller: a request waiting for a busy worker
// leaves the queue when its caller does; once the worker is free, the
// next one is served.
func TestWorkerPoolWaitEndsWithCaller(t *testing.T) {
	k := newWorker(Work{Workers: 1, Hold: time.Millisecond}, 1)
	k.slots <- struct{}{} // the only worker is busy
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := k.do(ctx); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("waiting past the deadline: got %v, want DeadlineExceeded", err)
	}
	<-k.slots
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := k.do(ctx2); err != nil {
		t.Fatalf("with the worker free: %v", err)
	}
	if n := len(k.slots); n != 0 {
		t.Fatalf("%d workers still held after the request", n)
	}
}

func TestWaitEndsWithCaller(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := newWorker(Work{Wait: time.Hour}, 1).do(ctx); status.Code(err) != codes.Canceled {
		t.Fatalf("got %v, want Canceled at once", err)
	}
}

func TestCalibrate(t *testing.T) {
	n, err := Calibrate(100 * time.Microsecond)
	if err != nil || n <= 0 {
		t.Fatalf("Calibrate: %d, %v", n, err)
	}
	if _, err := Calibrate(0); err == nil {
		t.Error("Calibrate(0): no error")
	}
	if a, b := spin(5), spin(5); a != b || a == spin(6) {
		t.Error("spin is not a function of its work")
	}
}

func TestCountsRefusals(t *testing.T) {
	c := Counts{
		Admission: map[string]int64{"limit": 5, "deadline": 2},
		Throttled: 3,
		RetryRefused: map[string]int64{
			interceptor.StopThrottled.String(): 4, // 3 of them the throttled attempts above
			interceptor.StopBudget.String():    6,
			interceptor.StopAttempts.String():  100, // not a refusal
		},
		TargetDown: 1, NotServing: 2,
	}
	if got := c.RetryDenied(); got != 7 {
		t.Errorf("RetryDenied: got %d, want 6 budget + 1 throttle", got)
	}
	if got := c.Refusals(); got != 7+3+7 {
		t.Errorf("Refusals: got %d, want 17", got)
	}
	if got := c.Downs(); got != 3 {
		t.Errorf("Downs: got %d, want 3", got)
	}
	d := c.Add(c).Sub(c)
	if d.Refusals() != c.Refusals() || d.Downs() != c.Downs() || d.Admission["limit"] != 5 {
		t.Errorf("Add then Sub: got %+v, want %+v", d, c)
	}
	if z := c.Sub(c); z.Refusals() != 0 || z.Admission != nil {
		t.Errorf("c - c: got %+v, want zero", z)
	}
}

// TestCounterObserves: the observer counts each kind of event the
// figures use, by reason.
func TestCounterObserves(t *testing.T) {
	var c counter
	ctx := context.Background()
	for _, e := range []interceptor.Event{
		{Kind: interceptor.EventAdmissionRefused, Admission: interceptor.AdmissionLimit},
		{Kind: interceptor.EventThrottled},
		{Kind: interceptor.EventRetryRefused, Reason: interceptor.StopThrottled},
		{Kind: interceptor.EventRetryRefused, Reason: interceptor.StopBudget},
		{Kind: interceptor.EventRetryScheduled},
		{Kind: interceptor.EventTargetDown},
		{Kind: interceptor.EventNotServing},
		{Kind: interceptor.EventAttemptStart}, // not counted
	} {
		c.Observe(ctx, e)
	}
	var got Counts
	c.fill(&got)
	if got.AdmissionRefused() != 1 || got.Throttled != 1 || got.RetryDenied() != 1 || got.Refusals() != 3 ||
		got.Retries != 1 || got.Downs() != 2 {
		t.Errorf("counted %+v", got)
	}
}

func TestLineWriter(t *testing.T) {
	w := newLineWriter()
	for _, b := range []string{"sta", "ts http://x\nlisten", "ing 127.0.0.1:1\n"} {
		if _, err := w.Write([]byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"stats http://x", "listening 127.0.0.1:1"} {
		if got := <-w.c; got != want {
			t.Errorf("line: got %q, want %q", got, want)
		}
	}
}

func TestLauncherReportsAFailedStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := testLauncher(t).Start(ctx, "payment", "--tier", "payment", "--fail", "7")
	if err == nil || !strings.Contains(err.Error(), "probability") {
		t.Fatalf("got %v, want the tier's own error", err)
	}
	var ee interface{ ExitCode() int }
	if errors.As(err, &ee) && ee.ExitCode() == 0 {
		t.Errorf("exit code 0 for a bad flag")
	}
}

// statsTier serves the stats port of a payment tier doing w until the
// test ends, and returns the tier, a Proc that reaches its port and a
// context for the test's requests.
func statsTier(t *testing.T, w Work) (*tier, *Proc, context.Context) {
	t.Helper()
	tr := &tier{name: "payment", work: newWorker(w, 1), obs: new(counter), arrivals: newArrivals(),
		svc: testsvc.NewTier("payment", nil, 1), log: io.Discard}
	stop, countsURL, err := serveStats("127.0.0.1:0", tr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return tr, &Proc{Name: "payment", stats: countsURL}, ctx
}

// TestFailAllEndpoint: the stats port switches a tier to failing
// everything and back, answers when it did, and refuses what is not a
// switch.
func TestFailAllEndpoint(t *testing.T) {
	tr, p, ctx := statsTier(t, Work{})
	serves := func() error { return tr.work.do(ctx) }
	if err := serves(); err != nil {
		t.Fatalf("before the switch: %v", err)
	}
	t0 := time.Now()
	on, err := p.SetFailAll(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := serves(); status.Code(err) != codes.Unavailable {
		t.Fatalf("fail-all on: got %v, want Unavailable", err)
	}
	off, err := p.SetFailAll(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := serves(); err != nil {
		t.Fatalf("fail-all off: %v", err)
	}
	if t1 := time.Now(); !(!on.Before(t0.Round(0)) && off.After(on) && !off.After(t1.Round(0))) {
		t.Errorf("switched on at %v and off at %v, want in order within [%v, %v]", on, off, t0, t1)
	}
	if _, err := p.Counts(ctx); err != nil {
		t.Errorf("counts: %v", err)
	}
	for _, tc := range []struct{ method, path string }{
		{http.MethodPost, pathFailAll + "?on=maybe"},
		{http.MethodPost, pathFailAll},
		{http.MethodGet, pathFailAll + "?on=1"},
	} {
		var v FailAllState
		if err := p.stat(ctx, tc.method, tc.path, &v); err == nil {
			t.Errorf("%s %s: no error", tc.method, tc.path)
		}
	}
	if err := serves(); err != nil {
		t.Fatalf("after the refused requests: %v", err)
	}
}

// TestSlowEndpoint: POST /slow?share=p switches the share of slow
// requests; a share outside [0, 1] or none is refused and changes
// nothing.
func TestSlowEndpoint(t *testing.T) {
	const wait, slowWait = time.Millisecond, time.Hour
	tr, p, ctx := statsTier(t, Work{Wait: wait, SlowWait: slowWait})
	if err := p.SetSlow(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if w, _ := tr.work.times(); w < slowWait/2 {
		t.Errorf("share 1: waited %v, want a slow request's", w)
	}
	for _, q := range []string{"?share=1.5", "?share=-0.1", "?share=NaN", "?share=x", ""} {
		var v SlowState
		if err := p.stat(ctx, http.MethodPost, pathSlow+q, &v); err == nil {
			t.Errorf("POST %s%s: no error", pathSlow, q)
		}
	}
	if err := p.SetSlow(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if w, _ := tr.work.times(); w != wait {
		t.Errorf("share 0: waited %v, want %v", w, wait)
	}
}

// TestWorkerFailAllStartsOn: --fail-all is the state a tier starts in,
// and the switch ends it.
func TestWorkerFailAllStartsOn(t *testing.T) {
	k := newWorker(Work{FailAll: true}, 1)
	ctx := context.Background()
	if err := k.do(ctx); status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	k.setFailAll(false)
	if err := k.do(ctx); err != nil {
		t.Fatalf("switched off: %v", err)
	}
}

func TestArrivals(t *testing.T) {
	a := newArrivals()
	for _, at := range []time.Duration{0, 999 * time.Microsecond, time.Millisecond, 3*time.Millisecond + 1, -1, arrivalsKept} {
		a.add(at)
	}
	s := a.snapshot()
	if want := []int64{2, 1, 0, 1}; !slices.Equal(s.Counts, want) || s.Late != 2 || s.Bucket != time.Millisecond {
		t.Fatalf("snapshot: counts %v, late %d, bucket %v; want %v, 2, 1ms", s.Counts, s.Late, s.Bucket, want)
	}
	ms := time.Millisecond
	// Bucket i starts at t0 + 0.5 ms + i ms on the caller's time line.
	s.Start = time.Unix(100, 0).Add(ms / 2)
	t0 := time.Unix(100, 0)
	for _, tc := range []struct {
		from, to time.Duration
		want     int64
	}{
		{0, 10 * ms, 4},
		{0, ms / 2, 0},
		{0, ms, 2},      // bucket 0 (at 0.5 ms)
		{ms, 3 * ms, 1}, // buckets 1 (at 1.5 ms) and 2
		{ms / 2, 4 * ms, 4},
		{-10 * ms, 0, 0},
		{4 * ms, 10 * ms, 0},
	} {
		if got := s.In(t0, tc.from, tc.to); got != tc.want {
			t.Errorf("In(%v, %v): %d, want %d", tc.from, tc.to, got, tc.want)
		}
	}
	// Buckets before t0 are not in any window from 0.
	s.Start = t0.Add(-2 * ms)
	if got := s.In(t0, 0, 10*ms); got != 1 {
		t.Errorf("series starting 2 ms early: In(0, 10ms) = %d, want 1 (bucket 3)", got)
	}
}
