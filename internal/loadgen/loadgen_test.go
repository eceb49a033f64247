package loadgen

import (
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/internal/testsvc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Sliced puts every request in the slice it started in and every call at
// the counted tier in some slice: on a healthy chain each request is one
// call at payment, so the sums match exactly.
func TestSlicedCountsEverything(t *testing.T) {
	c := testsvc.New(t, testsvc.Config{})
	if err := Warm(c); err != nil {
		t.Fatal(err)
	}
	pay := c.Tier("payment")
	stepped := 0
	s, sl := Sliced(c, 100, 300*time.Millisecond, 10*time.Second, 100*time.Millisecond,
		func() int64 { return pay.Received(testsvc.Unary) },
		[]Step{{At: 0, Do: func() { stepped++ }}, {At: 100 * time.Millisecond, Do: func() { stepped++ }}})
	if stepped != 2 {
		t.Errorf("steps taken: %d, want 2", stepped)
	}
	if len(sl) != 3 {
		t.Fatalf("%d slices, want 3", len(sl))
	}
	n, calls := 0, int64(0)
	for _, x := range sl {
		n += len(x.Samples)
		calls += x.Calls
	}
	if n != len(s) || n == 0 {
		t.Errorf("samples in slices: %d, all samples %d", n, len(s))
	}
	if s.Success() != 1 || calls != int64(len(s)) {
		t.Errorf("success %v, calls at payment %d for %d requests: want 1, one call each", s.Success(), calls, len(s))
	}
	if w := Sum(sl, 0, time.Second); len(w.Samples) != n || w.Calls != calls {
		t.Errorf("Sum: %d samples %d calls, want %d %d", len(w.Samples), w.Calls, n, calls)
	}
}

func TestRecovery(t *testing.T) {
	ms := time.Millisecond
	s := Samples{
		{Start: 1000 * ms, Code: codes.Unavailable},
		{Start: 1030 * ms, Code: codes.Unavailable},
		{Start: 1040 * ms, Code: codes.OK},
		{Start: 1060 * ms, Code: codes.OK},
	}
	if d, ok := s.Recovery(1000*ms, 2000*ms, 25*ms); d != 50*ms || !ok {
		t.Errorf("Recovery: %v %v, want 50ms true", d, ok)
	}
	if _, ok := s.Recovery(1000*ms, 1050*ms, 25*ms); ok {
		t.Errorf("Recovery over a load that ends failing: ok, want not")
	}
	// The second-to-last slice is the last bad one: the users were
	// served again in the last (review of 2026-12-05: read as never).
	s = Samples{{Start: 1800 * ms, Code: codes.Unavailable}, {Start: 1950 * ms, Code: codes.OK}}
	if d, ok := s.Recovery(0, 2000*ms, 100*ms); d != 1900*ms || !ok {
		t.Errorf("Recovery, the last slice served: %v %v, want 1.9s true", d, ok)
	}
	if d, ok := s.Recovery(0, 2050*ms, 100*ms); d != 1900*ms || !ok { // a partial slice at the end is not one
		t.Errorf("Recovery, a partial slice after the last: %v %v, want 1.9s true", d, ok)
	}
}

// Percentile is the nearest rank: at least p of the samples are at or
// below it. With 100 samples p99 is the 99th, not the largest; with 400
// of which 4 slow, p99 is fast (review of 2026-12-05: one rank too high
// whenever p x n was whole).
func TestPercentileNearestRank(t *testing.T) {
	var s Samples
	for i := 1; i <= 100; i++ {
		s = append(s, Sample{Latency: time.Duration(i) * time.Millisecond})
	}
	for p, want := range map[float64]time.Duration{0.99: 99, 0.5: 50, 1: 100, 0: 1, 0.001: 1, 0.995: 100} {
		if got := s.Percentile(p); got != want*time.Millisecond {
			t.Errorf("Percentile(%v) of 1..100 ms: %v, want %v", p, got, want*time.Millisecond)
		}
	}
	s = nil
	for i := range 400 {
		l := 3 * time.Millisecond
		if i%100 == 0 {
			l = 100 * time.Millisecond
		}
		s = append(s, Sample{Latency: l})
	}
	if got := s.Percentile(0.99); got != 3*time.Millisecond {
		t.Errorf("p99 of 400 with 4 slow: %v, want 3ms", got)
	}
}
