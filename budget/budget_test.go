package budget

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newBudget returns a Budget on a fake clock set to epoch.
func newBudget(t *testing.T, cfg Config) (*Budget, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(epoch)
	cfg.Clock = clk
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return b, clk
}

// record calls RecordRequest n times.
func record(b *Budget, n int) {
	for range n {
		b.RecordRequest()
	}
}

// grantAll asks TryRetry until it refuses (or a safety limit) and returns
// the number granted.
func grantAll(t *testing.T, b *Budget) int {
	t.Helper()
	n := 0
	for b.TryRetry() {
		n++
		if n > 1_000_000 {
			t.Fatal("TryRetry never refused")
		}
	}
	return n
}

func TestNewDefaults(t *testing.T) {
	b, err := New(Config{})
	if err != nil {
		t.Fatalf("New(Config{}): %v", err)
	}
	got := b.Config()
	if got.Ratio != DefaultRatio || got.Window != DefaultWindow ||
		got.MinRetriesPerSecond != DefaultMinRetriesPerSecond || got.NoFloor {
		t.Errorf("defaults: got %+v, want ratio %v window %v floor %v", got, DefaultRatio, DefaultWindow, DefaultMinRetriesPerSecond)
	}
	if _, ok := got.Clock.(clock.Real); !ok {
		t.Errorf("default clock: got %T, want clock.Real", got.Clock)
	}
	// A real-clock budget with no requests allows exactly the floor.
	if got, want := grantAll(t, b), 100; got != want {
		t.Errorf("retries with the default floor: got %d, want %d", got, want)
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		field string // empty: valid
	}{
		{"zero", Config{}, ""},
		{"all set", Config{Ratio: 0.5, Window: time.Minute, MinRetriesPerSecond: 0.5}, ""},
		{"ratio 1", Config{Ratio: 1}, ""},
		{"tiny ratio", Config{Ratio: 1e-9}, ""},
		{"window min", Config{Window: MinWindow}, ""},
		{"window max", Config{Window: MaxWindow}, ""},
		{"no floor", Config{NoFloor: true}, ""},
		{"ratio negative", Config{Ratio: -0.1}, "Ratio"},
		{"ratio above 1", Config{Ratio: 1.01}, "Ratio"},
		{"ratio NaN", Config{Ratio: math.NaN()}, "Ratio"},
		{"ratio +Inf", Config{Ratio: math.Inf(1)}, "Ratio"},
		{"ratio -Inf", Config{Ratio: math.Inf(-1)}, "Ratio"},
		{"window negative", Config{Window: -time.Second}, "Window"},
		{"window too short", Config{Window: 999 * time.Millisecond}, "Window"},
		{"window too long", Config{Window: MaxWindow + 1}, "Window"},
		{"floor negative", Config{MinRetriesPerSecond: -1}, "MinRetriesPerSecond"},
		{"floor NaN", Config{MinRetriesPerSecond: math.NaN()}, "MinRetriesPerSecond"},
		{"floor +Inf", Config{MinRetriesPerSecond: math.Inf(1)}, "MinRetriesPerSecond"},
		{"floor -Inf", Config{MinRetriesPerSecond: math.Inf(-1)}, "MinRetriesPerSecond"},
		{"floor with NoFloor", Config{MinRetriesPerSecond: 1, NoFloor: true}, "MinRetriesPerSecond"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(tt.cfg)
			if tt.field == "" {
				if err != nil || b == nil {
					t.Fatalf("New(%+v) = %v, %v; want a budget", tt.cfg, b, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("New(%+v): got no error, want one naming %s", tt.cfg, tt.field)
			}
			if b != nil {
				t.Errorf("New(%+v): got a budget with the error, want nil", tt.cfg)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("got error %v, want it to wrap ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("got error %q, want it to name %s", err, tt.field)
			}
		})
	}
}

func TestRatioAndFloor(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		requests int
		want     int // retries granted before the first refusal
	}{
		{"ratio only", Config{Ratio: 0.2, NoFloor: true}, 100, 20},
		{"ratio only, rounds up", Config{Ratio: 0.2, NoFloor: true}, 101, 21}, // 20.2 allows 21
		{"ratio 1", Config{Ratio: 1, NoFloor: true}, 7, 7},
		{"no floor, no requests", Config{NoFloor: true}, 0, 0},
		{"default floor, no requests", Config{}, 0, 100},              // 10/s x 10s
		{"default floor plus ratio", Config{}, 1000, 300},             // 200 + 100
		{"fractional floor", Config{MinRetriesPerSecond: 0.25}, 0, 3}, // 2.5 allows 3
		{"floor over a 1m window", Config{MinRetriesPerSecond: 1, Window: time.Minute, NoFloor: false}, 0, 60},
		{"quiet client", Config{Ratio: 0.2, MinRetriesPerSecond: 0.1}, 3, 2}, // 0.6 + 1 = 1.6 allows 2
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _ := newBudget(t, tt.cfg)
			record(b, tt.requests)
			if got := grantAll(t, b); got != tt.want {
				t.Errorf("granted: got %d, want %d", got, tt.want)
			}
			s := b.Snapshot()
			if s.Requests != int64(tt.requests) || s.Retries != int64(tt.want) || s.Granted != int64(tt.want) || s.Refused != 1 {
				t.Errorf("snapshot: got %+v, want requests %d, retries and granted %d, refused 1", s, tt.requests, tt.want)
			}
			// More requests make room again.
			if tt.cfg.Ratio > 0 {
				record(b, int(math.Ceil(1/tt.cfg.Ratio)))
				if !b.TryRetry() {
					t.Errorf("after %v more requests: TryRetry refused, want granted", math.Ceil(1/tt.cfg.Ratio))
				}
			}
		})
	}
}

// A quiet client that sends one request every few seconds can still retry
// each of them, thanks to the floor; without it, it could not.
func TestQuietClient(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
		want int
	}{
		{"default floor", Config{}, 30},
		// Without a floor, a retry is granted only while the window holds
		// none (0 < 0.2 x 4 requests): at 0s, 12s, 24s, ... 84s.
		{"no floor", Config{NoFloor: true}, 8},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, clk := newBudget(t, tt.cfg)
			granted := 0
			for range 30 {
				b.RecordRequest()
				if b.TryRetry() {
					granted++
				}
				clk.Advance(3 * time.Second)
			}
			if granted != tt.want {
				t.Errorf("retries granted to a client sending 1 request / 3s: got %d, want %d", granted, tt.want)
			}
		})
	}
}

// Buckets expire one by one: bucket k (1s wide) holds k+1 requests and
// k%2 retries, and each leaves the window exactly 10 buckets after it
// started.
func TestWindowExpiryBucketByBucket(t *testing.T) {
	b, clk := newBudget(t, Config{Ratio: 1, NoFloor: true})
	wantRetries := 0
	for k := range 10 {
		clk.Set(epoch.Add(time.Duration(k)*time.Second + 500*time.Millisecond))
		record(b, k+1)
		if k%2 == 1 {
			if !b.TryRetry() {
				t.Fatalf("bucket %d: TryRetry refused", k)
			}
			wantRetries++
		}
	}
	tests := []struct {
		at       time.Duration
		requests int64
		retries  int64
	}{
		{9500 * time.Millisecond, 55, 5},
		{10*time.Second - 1, 55, 5},
		{10 * time.Second, 54, 5}, // bucket 0: 1 request, no retry
		{11 * time.Second, 52, 4}, // bucket 1: 2 requests, 1 retry
		{11*time.Second + 999*time.Millisecond, 52, 4},
		{12 * time.Second, 49, 4},
		{15 * time.Second, 34, 2},
		{17 * time.Second, 19, 1},
		{18 * time.Second, 10, 1},
		{19*time.Second - 1, 10, 1},
		{19 * time.Second, 0, 0},
		{time.Hour, 0, 0},
	}
	for _, tt := range tests {
		clk.Set(epoch.Add(tt.at))
		s := b.Snapshot()
		if s.Requests != tt.requests || s.Retries != tt.retries {
			t.Errorf("at %v: got requests %d retries %d, want %d and %d", tt.at, s.Requests, s.Retries, tt.requests, tt.retries)
		}
	}
	if got := b.Snapshot().Granted; got != int64(wantRetries) {
		t.Errorf("granted total: got %d, want %d", got, wantRetries)
	}
}

// Expired retries free the budget; a new request in a reused slot does not
// inherit the slot's old counts.
func TestRetriesExpire(t *testing.T) {
	b, clk := newBudget(t, Config{Ratio: 0.5, NoFloor: true})
	record(b, 10)
	if got, want := grantAll(t, b), 5; got != want {
		t.Fatalf("granted: got %d, want %d", got, want)
	}
	clk.Advance(5 * time.Second)
	record(b, 2) // 12 requests, 5 retries: 6 allowed
	if got, want := grantAll(t, b), 1; got != want {
		t.Fatalf("after 2 more requests: got %d, want %d", got, want)
	}
	clk.Advance(5 * time.Second) // bucket 0 (10 requests, 5 retries) expires
	s := b.Snapshot()
	if s.Requests != 2 || s.Retries != 1 {
		t.Fatalf("after bucket 0 expired: got requests %d retries %d, want 2 and 1", s.Requests, s.Retries)
	}
	record(b, 4) // lands in slot 0 again, epoch 10
	s = b.Snapshot()
	if s.Requests != 6 || s.Retries != 1 {
		t.Fatalf("after reusing slot 0: got requests %d retries %d, want 6 and 1", s.Requests, s.Retries)
	}
	if got, want := grantAll(t, b), 2; got != want {
		t.Errorf("granted: got %d, want %d", got, want)
	}
}

func TestBurstAfterLongIdle(t *testing.T) {
	for _, idle := range []time.Duration{10 * time.Second, time.Hour, 1000 * time.Hour} {
		b, clk := newBudget(t, Config{})
		record(b, 1000)
		if got, want := grantAll(t, b), 300; got != want {
			t.Fatalf("before idling: granted %d, want %d", got, want)
		}
		clk.Advance(idle)
		if s := b.Snapshot(); s.Requests != 0 || s.Retries != 0 || s.Ratio != 0 {
			t.Errorf("after %v idle: got %+v, want an empty window", idle, s)
		}
		if got, want := grantAll(t, b), 100; got != want {
			t.Errorf("burst after %v idle: got %d retries, want the floor, %d", idle, got, want)
		}
	}
}

func TestClockGoesBack(t *testing.T) {
	b, clk := newBudget(t, Config{Ratio: 0.5, NoFloor: true})
	clk.Advance(5 * time.Second)
	record(b, 10)
	clk.Advance(-time.Hour) // far back: before New
	record(b, 10)
	if got, want := grantAll(t, b), 10; got != want {
		t.Errorf("granted after the clock went back: got %d, want %d", got, want)
	}
	s := b.Snapshot()
	if s.Requests != 20 || s.Retries != 10 {
		t.Errorf("after the clock went back: got requests %d retries %d, want 20 and 10", s.Requests, s.Retries)
	}
	// Time stands still at t=5s until the clock catches up: at t=10s,
	// 5s after the latest reading, nothing has expired yet.
	clk.Set(epoch.Add(14*time.Second + 999*time.Millisecond))
	if s := b.Snapshot(); s.Requests != 20 {
		t.Errorf("at 14.999s: got %d requests, want 20", s.Requests)
	}
	clk.Set(epoch.Add(15 * time.Second))
	if s := b.Snapshot(); s.Requests != 0 || s.Retries != 0 {
		t.Errorf("at 15s: got %+v, want an empty window", s)
	}
	// And the budget still works normally.
	record(b, 4)
	if got, want := grantAll(t, b), 2; got != want {
		t.Errorf("granted after recovering: got %d, want %d", got, want)
	}
	if got, want := b.last.Load(), int64(15); got != want {
		t.Errorf("latest bucket: got %d, want %d", got, want)
	}
}

// A caller that computed its bucket a full turn of the ring ago must not
// reset the newer bucket that now holds its slot.
func TestDelayedCallerDoesNotResetNewerBucket(t *testing.T) {
	b, clk := newBudget(t, Config{Ratio: 1, NoFloor: true})
	clk.Advance(12 * time.Second) // bucket 12, slot 2
	record(b, 3)
	slot := b.buckets[2].requests.Load()
	idx := int64(2) // a delayed caller still at bucket 2
	if _, ok := b.increment(slot, &idx); ok {
		t.Fatalf("increment of a newer bucket from index 2: got ok, want a refresh")
	}
	if idx != 12 {
		t.Fatalf("refreshed index: got %d, want 12", idx)
	}
	next, ok := b.increment(slot, &idx)
	if !ok || next != slot+1 {
		t.Fatalf("increment at index 12: got %#x, %v; want %#x, true", next, ok, slot+1)
	}
}

func TestIncrementWrappedEpoch(t *testing.T) {
	b, _ := newBudget(t, Config{})
	// A tag that looks newer than the latest index because it wrapped.
	w := uint64(1<<31+5)<<32 | 7
	idx := int64(5)
	next, ok := b.increment(w, &idx)
	if !ok || next != uint64(5)<<32|1 {
		t.Errorf("increment of a wrapped tag: got %#x, %v; want %#x, true", next, ok, uint64(5)<<32|1)
	}
	// A saturated counter stays saturated.
	w = uint64(5)<<32 | countMask
	if next, ok := b.increment(w, &idx); !ok || next != w {
		t.Errorf("increment of a saturated count: got %#x, %v; want %#x, true", next, ok, w)
	}
}

func TestSnapshotRatio(t *testing.T) {
	b, _ := newBudget(t, Config{Ratio: 0.5, NoFloor: true})
	if s := b.Snapshot(); s.Ratio != 0 {
		t.Errorf("empty: got ratio %v, want 0", s.Ratio)
	}
	record(b, 8)
	b.TryRetry()
	b.TryRetry()
	s := b.Snapshot()
	if s.Ratio != 0.25 || s.Tokens != 0 || s.MaxTokens != 0 {
		t.Errorf("got %+v, want ratio 0.25 and no tokens", s)
	}
	b.RecordOutcome(false) // ignored
	if s2 := b.Snapshot(); s2 != s {
		t.Errorf("RecordOutcome changed the snapshot: got %+v, want %+v", s2, s)
	}
}

// TestExactRatio: the decision is exact in decimal: 0.07 x 100 requests
// allows 7 retries (float64 makes it 7.000000000000001 and would allow 8).
func TestExactRatio(t *testing.T) {
	b, err := New(Config{Ratio: 0.07, NoFloor: true, Clock: clock.NewFake(time.Unix(0, 0))})
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		b.RecordRequest()
	}
	granted := 0
	for range 20 {
		if b.TryRetry() {
			granted++
		}
	}
	if granted != 7 {
		t.Fatalf("granted %d retries for 100 requests at ratio 0.07, want 7", granted)
	}
}
