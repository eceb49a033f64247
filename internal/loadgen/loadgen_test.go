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
}
