package busy

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

func TestDueBy(t *testing.T) {
	phases := []Phase{{Rate: 1000, For: time.Second}, {Rate: 100, For: time.Second}}
	for _, tc := range []struct {
		at   time.Duration
		due  int
		next time.Duration
	}{
		{0, 1, time.Millisecond},
		{time.Millisecond / 2, 1, time.Millisecond},
		{500 * time.Millisecond, 501, 501 * time.Millisecond},
		{time.Second, 1001, time.Second + 10*time.Millisecond},
		{2 * time.Second, 1100, 2 * time.Second},
	} {
		due, next := dueBy(phases, tc.at)
		if due != tc.due || (next-tc.next).Abs() > time.Microsecond {
			t.Errorf("dueBy(%v): got %d, %v; want %d, %v", tc.at, due, next, tc.due, tc.next)
		}
	}
}

// ghzJSON is the shape of ghz v0.93.0's JSON report (trimmed): each
// detail's timestamp is the request's end.
const ghzJSON = `{"count":3,"details":[
{"timestamp":"2026-01-01T00:00:00.010Z","latency":10000000,"error":"","status":"OK"},
{"timestamp":"2026-01-01T00:00:00.004Z","latency":2000000,"error":"rpc error: code = Unavailable desc = x","status":"Unavailable"},
{"timestamp":"2026-01-01T00:00:00.030Z","latency":5000000,"error":"x","status":""}]}`

func TestParseGhz(t *testing.T) {
	s, t0, err := parseGhz([]byte(ghzJSON))
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC); !t0.Equal(want) {
		t.Errorf("start %v, want %v (the first request's)", t0, want)
	}
	want := Samples{
		{Start: 0, Latency: 10 * time.Millisecond, Code: codes.OK},
		{Start: 2 * time.Millisecond, Latency: 2 * time.Millisecond, Code: codes.Unavailable},
		{Start: 25 * time.Millisecond, Latency: 5 * time.Millisecond, Code: codes.Unknown},
	}
	if !slices.Equal(s, want) {
		t.Errorf("got %+v, want %+v", s, want)
	}
	for _, bad := range []string{`{`, `{"count":2,"details":[]}`, `{"count":0,"details":[]}`} {
		if _, _, err := parseGhz([]byte(bad)); err == nil {
			t.Errorf("parseGhz(%s): no error", bad)
		}
	}
}

func TestFiguresAndMedian(t *testing.T) {
	ms := time.Millisecond
	r := Run{Stack: baseline, Result: Result{Length: time.Second, Samples: Samples{
		{Start: 0, Latency: 10 * ms, Code: codes.OK},
		{Start: 100 * ms, Latency: 990 * ms, Code: codes.OK}, // ends after the load: not goodput
		{Start: 200 * ms, Latency: ms, Code: codes.Unavailable},
		{Start: 300 * ms, Latency: 20 * ms, Code: codes.OK},
	}}, Counts: ChainCounts{Tiers: []Counts{{Received: 8, CPU: 3e6}, {CPU: 1e6}, {CPU: 4e6}}, Payments: 1}}
	f := figures(r, 0, time.Second)
	if f.Requests != 4 || f.Success != 0.75 || f.Goodput != 2 || f.PaymentPerRequest != 2 || !f.Counted || f.TierCPU != 2*ms {
		t.Errorf("figures: %+v", f)
	}
	if f.P99OK != 990*ms || f.P99 != 990*ms {
		t.Errorf("p99: %v, of successes %v", f.P99, f.P99OK)
	}
	m := median([]Figures{{Success: 0.5, Refusals: 9}, {Success: 0.9, Refusals: 1}, {Success: 0.7, Refusals: 5}})
	if m.Success != 0.7 || m.Refusals != 5 {
		t.Errorf("median: %+v", m)
	}
	if got := medianOf([]int{4, 1, 3, 2}); got != 2 {
		t.Errorf("medianOf 4 values: %d, want the lower middle 2", got)
	}
	sl := slicesOf(r.Samples, 500*ms, time.Second)
	if len(sl) != 2 || sl[0].Success != 0.75 || sl[1].Success != -1 || sl[0].Goodput != 4 || sl[0].P99OK != 990*ms || sl[1].P99OK != 0 {
		t.Errorf("slices: %+v", sl)
	}
	if sl := slicesOf(r.Samples, 400*ms, time.Second); len(sl) != 2 {
		t.Errorf("slices of 400ms over 1s: %d, want 2 (the last, of 200ms, left out)", len(sl))
	}
	m2 := medianSlices([][]Slice{{{P99OK: 3 * ms}}, {{P99OK: ms}}, {{P99OK: 2 * ms}}})
	if len(m2) != 1 || m2[0].P99OK != 2*ms {
		t.Errorf("median slices: %+v, want p99 2ms", m2)
	}
	// A run with no success in a slice (p99 0) has no p99 there: the
	// median is the others', not pulled down (review of 2026-12-05).
	m3 := medianSlices([][]Slice{{{P99OK: 0}}, {{P99OK: 900 * ms}}, {{P99OK: 1000 * ms}}})
	if m3[0].P99OK != 900*ms && m3[0].P99OK != 1000*ms || m3[0].P99OK == 0 {
		t.Errorf("median slices with a run without success: p99 %v, want that of a run with successes", m3[0].P99OK)
	}
	if m := median([]Figures{{P99OK: 0}, {P99OK: 0}, {P99OK: 5 * ms}}); m.P99OK != 5*ms {
		t.Errorf("median p99 of successes, two runs without: %v, want 5ms", m.P99OK)
	}
}

// With the payment arrivals of the run (overload), the calls at payment
// per request are those of the window, not the whole run's: 100 requests
// and calls in the first second, 1000 requests and 500 calls in the next
// five, 0.5 per request there (review of 2026-12-05: 600/1100 read).
func TestFiguresPaymentOfTheWindow(t *testing.T) {
	ms := time.Millisecond
	var s Samples
	for i := range 100 {
		s = append(s, Sample{Start: time.Duration(i) * 10 * ms, Latency: ms, Code: codes.OK})
	}
	for i := range 1000 {
		s = append(s, Sample{Start: time.Second + time.Duration(i)*5*ms, Latency: ms, Code: codes.OK})
	}
	start := time.Unix(1000, 0)
	counts := make([]int64, 6000) // 1 ms buckets from the load's start
	for i := range 100 {
		counts[i*10]++
	}
	for i := range 500 {
		counts[1000+i*10]++
	}
	r := Run{Stack: baseline, Result: Result{Start: start, Length: 6 * time.Second, Samples: s,
		Payment: []Arrivals{{Start: start, Bucket: ms, Counts: counts}}},
		Counts: ChainCounts{Tiers: []Counts{{Received: 600}, {}, {}}, Payments: 1}}
	if f := figures(r, time.Second, 6*time.Second); f.PaymentPerRequest != 0.5 {
		t.Errorf("calls at payment per request in the overload: %v, want 0.5", f.PaymentPerRequest)
	}
	if f := figures(r, 0, time.Second); f.PaymentPerRequest != 1 {
		t.Errorf("calls at payment per request before it: %v, want 1", f.PaymentPerRequest)
	}
}

func TestCountCell(t *testing.T) {
	for _, tc := range []struct {
		f    Figures
		want string
	}{
		{Figures{Counted: true}, "0"},
		{Figures{Counted: true, RefusalsMax: 3, Runs: 3}, "0, max 3"},
		{Figures{Counted: true, Refusals: 5, RefusalsMax: 5, Admission: 4, RetryDenied: 1}, "5 (4 shed, 1 retry denied)"},
		{Figures{Refusals: 5}, "n/a"},
	} {
		if got := refusals(tc.f); got != tc.want {
			t.Errorf("refusals(%+v): got %q, want %q", tc.f, got, tc.want)
		}
	}
	if got := downs(Figures{Counted: true, Downs: 1, TargetDown: 1, DownsMax: 2}); got != "1 (1 target down), max 2" {
		t.Errorf("downs: got %q", got)
	}
	m := median([]Figures{{Refusals: 0, RefusalsMax: 0}, {Refusals: 4, RefusalsMax: 4}, {Refusals: 0, RefusalsMax: 0}})
	if m.Refusals != 0 || m.RefusalsMax != 4 {
		t.Errorf("median of refusals 0, 4, 0: %d, max %d; want 0, max 4", m.Refusals, m.RefusalsMax)
	}
}

// TestOutageWindows: the per-slice windows run from OutageShown before
// down to OutageAfter after back, the outage's last one ends at back
// (a kill comes back late), and each window's figures are its requests'
// success and the calls at payment (every process) per request.
func TestOutageWindows(t *testing.T) {
	ms := time.Millisecond
	p := Params{OutageShown: time.Second, OutageFor: 2 * time.Second, OutageAfter: 2 * time.Second, OutageSlice: 500 * ms}
	ws := p.outageSlices()
	var labels []string
	for _, w := range ws {
		labels = append(labels, w.label)
	}
	want := []string{"down -1.0 s", "down -0.5 s", "down +0", "down +0.5 s", "down +1.0 s", "down +1.5 s", "back +0", "back +0.5 s", "back +1.0 s", "back +1.5 s"}
	if !slices.Equal(labels, want) {
		t.Fatalf("labels %q, want %q", labels, want)
	}
	t0 := time.Unix(1000, 0)
	o := &Outage{Down: 2 * time.Second, Restart: 4050 * ms, Back: 4100 * ms, Payment: []Arrivals{
		{Start: t0, Bucket: ms, Counts: []int64{0, 5}},                   // 5 calls at 1 ms
		{Start: t0.Add(4100 * ms), Bucket: ms, Counts: []int64{2, 0, 1}}, // the new process: 3 calls after back
	}}
	for i, tc := range []struct{ from, to time.Duration }{
		{1000 * ms, 1500 * ms}, {1500 * ms, 2000 * ms}, {2000 * ms, 2500 * ms}, {2500 * ms, 3000 * ms},
		{3000 * ms, 3500 * ms}, {3500 * ms, 4100 * ms}, {4100 * ms, 4600 * ms}, {4600 * ms, 5100 * ms},
		{5100 * ms, 5600 * ms}, {5600 * ms, 6100 * ms},
	} {
		if from, to := ws[i].span(o); from != tc.from || to != tc.to {
			t.Errorf("%s: [%v, %v), want [%v, %v)", ws[i].label, from, to, tc.from, tc.to)
		}
	}
	r := Run{Result: Result{Start: t0, Length: 6 * time.Second, Outage: o, Samples: Samples{
		{Start: 0, Latency: ms, Code: codes.OK},
		{Start: 4200 * ms, Latency: ms, Code: codes.OK},
		{Start: 4300 * ms, Latency: ms, Code: codes.Unavailable},
		{Start: 4400 * ms, Latency: ms, Code: codes.OK},
	}}}
	if f := outageFigure(r, ws[6]); f.success != 2.0/3 || f.calls != 1 {
		t.Errorf("back +0: %+v, want success 2/3 and 3 calls for 3 requests", f)
	}
	if f := outageFigure(r, outageWindow{from: -2 * time.Second, to: -time.Second}); f.success != 1 || f.calls != 5 {
		t.Errorf("[0, 1 s): %+v, want success 1 and 5 calls for 1 request", f)
	}
	if f := outageFigure(r, ws[2]); f.success != -1 || f.calls != -1 {
		t.Errorf("no request in down +0: %+v, want -1, -1", f)
	}
	r.Length = 5500 * ms
	if f := outageFigure(r, ws[9]); f.success != -1 {
		t.Errorf("a window past the load: %+v, want -1", f)
	}
	if got := tierCell([]tierKind{{0, "shed"}, {12, "throttled"}, {1, "down"}}); got != "12 throttled, 1 down" {
		t.Errorf("tierCell: %q", got)
	}
	if got := tierCell([]tierKind{{0, "shed"}}); got != "-" {
		t.Errorf("tierCell of zeros: %q, want -", got)
	}
}
