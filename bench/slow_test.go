package bench

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

func TestSlowStacksBuild(t *testing.T) {
	for _, s := range SlowStacks(DefaultSlowParams) {
		if _, err := s.New(nil, 1); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
	}
}

// TestSlowRecovery: recovery is the start of the first slice after the
// slowdown that begins a second of slices with >= 95 % success.
func TestSlowRecovery(t *testing.T) {
	slice := func(from time.Duration, ok, failed int) SlowSlice {
		sl := SlowSlice{From: from}
		for range ok {
			sl.Samples = append(sl.Samples, Sample{Start: from, Code: codes.OK})
		}
		for range failed {
			sl.Samples = append(sl.Samples, Sample{Start: from, Code: codes.Unavailable})
		}
		return sl
	}
	const q = 250 * time.Millisecond
	s := Slow{BackAt: 4 * q}
	for i, good := range []bool{true, false, false, false, false, true, false, true, true, true, true, false} {
		if good {
			s.Slices = append(s.Slices, slice(time.Duration(i)*q, 100, 0))
		} else {
			s.Slices = append(s.Slices, slice(time.Duration(i)*q, 90, 10))
		}
	}
	if got, want := s.Recovery(), 3*q; got != want {
		t.Fatalf("Recovery: got %v, want %v", got, want)
	}
	s.Slices[10] = slice(10*q, 50, 50)
	if got := s.Recovery(); got != -1 {
		t.Fatalf("Recovery with no good second: got %v, want -1", got)
	}
}
