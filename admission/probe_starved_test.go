package admission

import (
	"testing"
	"time"
)

// A probe's verdict outlasts a window in which a starved tier read
// nothing. Traced in busy's CPU-bound overload (every tier of a chain on
// two busy cores): a gateway at twice its chain's capacity, open loop,
// read 9 arrivals in its probe's second half of 12 ms where 8 a
// millisecond had come before; read as a closed loop's pause, that ended
// the overload, and the gateway, flooded, never refused again. Here the
// server reads 12 ms of every 30 late, at once at their end, and an open
// loop at twice its capacity stays overloaded until it ends (before, its
// overload ended in 7 seeds of 8).
func TestProbeOutlastsAStarvedWindow(t *testing.T) {
	for seed := range uint64(8) {
		s := starvedOverload(t, seed, 30*time.Millisecond, 12*time.Millisecond, 4*time.Second)
		was, ever, ends := false, false, 0
		for d := time.Second; d < 4*time.Second; d += time.Millisecond {
			s.at(d, func() {
				o := s.l.Overloaded()
				if was && !o {
					ends++
				}
				was, ever = o, ever || o
			})
		}
		s.run(4 * time.Second)
		if !ever {
			t.Fatalf("seed %d: never overloaded at twice its capacity: the test shows nothing", seed)
		}
		if ends > 0 {
			t.Errorf("seed %d: the overload ended %d times while the open loop went on at twice the capacity", seed, ends)
		}
	}
}

// starvedOverload returns a simulated server on 2 workers of 1 ms, sent
// open-loop arrivals at half its capacity for a second and then at
// twice it until end, 1 s deadlines, which reads what is sent in the
// first gap of every period from the second on only at the gap's end.
func starvedOverload(t *testing.T, seed uint64, every, gap, end time.Duration) *sim {
	t.Helper()
	const workers, service = 2, time.Millisecond
	capacity := workers / service.Seconds()
	s := newSim(t, Config{}, workers, service, seed)
	s.late = true
	s.starve = func(sent time.Duration) time.Duration {
		if sent >= time.Second && sent%every < gap {
			return sent.Truncate(every) + gap
		}
		return sent
	}
	s.open(0.5*capacity, 0, time.Second, time.Second)
	s.open(2*capacity, time.Second, end, time.Second)
	return s
}

// A process that stalled past both of a probe's timers may run its end
// first, or the two microseconds apart: the probe then decides nothing
// (before, it judged the arrivals since the limiter was made, or over
// microseconds in which nothing arrived, and could end a real
// overload).
func TestProbeAfterAStallDecidesNothing(t *testing.T) {
	const half = 40 * time.Millisecond
	for _, tc := range []struct {
		name  string
		first time.Duration // advanced before the end runs
	}{
		{"end before the half-way point", half / 2},
		{"end microseconds after it", half + time.Microsecond},
	} {
		clk := newTimerClock()
		l, err := New(Config{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		l.mu.Lock()
		l.probe.begin(l, 1e-6, half, func(*chan struct{}) {}) // 1 000 a second before it
		h := l.probe.hold.Load()
		l.mu.Unlock()
		clk.Advance(tc.first)
		l.mu.Lock()
		fell, ok := l.probe.end(l, h)
		l.mu.Unlock()
		if !ok || fell {
			t.Errorf("%s: ok %v, fell %v; want the probe ended, nothing decided", tc.name, ok, fell)
		}
		if l.probe.hold.Load() != nil || !isClosed(*h) {
			t.Errorf("%s: the hold is still there", tc.name)
		}
	}
}
