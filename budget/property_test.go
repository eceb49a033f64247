package budget

import (
	"math/rand"
	"reflect"
	"sort"
	"testing"
	"testing/quick"
	"time"
)

// script is a random sequence of operations on a Budget; each element
// encodes one: a request, a retry ask, a small or large step of the clock,
// or a step back.
type script []uint32

// Generate makes scripts long enough to cover several windows.
func (script) Generate(r *rand.Rand, size int) reflect.Value {
	s := make(script, r.Intn(size*40+1))
	for i := range s {
		s[i] = r.Uint32()
	}
	return reflect.ValueOf(s)
}

// params is a random valid Config, chosen so that the model can decide in
// exact integers of its own: Ratio is Percent/100, the floor Eighths/8
// retries a second, and Window a whole number of seconds.
type params struct {
	Percent int // Ratio x 100, 1 to 100
	Seconds int // Window in seconds, 1 to 30
	Eighths int // MinRetriesPerSecond x 8; 0 means NoFloor
}

func (params) Generate(r *rand.Rand, size int) reflect.Value {
	p := params{Percent: r.Intn(100) + 1, Seconds: r.Intn(30) + 1}
	if r.Intn(3) > 0 {
		p.Eighths = r.Intn(20)
	}
	return reflect.ValueOf(p)
}

// event is one request or granted retry, placed in the bucket of the
// latest clock reading at the time.
type event struct {
	bucket int64
	retry  bool
}

// TestPropertyBudgetBound drives a Budget with random scripts and checks it
// against a model of the documented semantics: time in buckets of
// Window/10, a clock that goes back stands still, the window is the current
// bucket and the 9 before it, and a retry is granted iff retries <
// Ratio*requests + floor in that window. Every decision and every snapshot
// must match the model. It then checks the bounds the type comment
// promises, on the retries the Budget actually granted:
//
//   - right after each grant, retries in the window <= ceil(Ratio*requests + floor);
//   - over every 10 consecutive buckets, retries <= ceil(Ratio*requests + floor),
//     where requests are counted over those buckets and the 9 before them:
//     requests expire before the retries they allowed, so a window's own
//     requests are not enough.
func TestPropertyBudgetBound(t *testing.T) {
	check := func(p params, s script) bool {
		winLen := time.Duration(p.Seconds) * time.Second
		cfg := Config{Ratio: float64(p.Percent) / 100, Window: winLen,
			MinRetriesPerSecond: float64(p.Eighths) / 8, NoFloor: p.Eighths == 0}
		b, clk := newBudget(t, cfg)
		width := int64(winLen / numBuckets)

		var (
			events  []event
			elapsed time.Duration // fake clock minus epoch
			latest  time.Duration // the latest reading, never negative
		)
		// span counts the events of buckets k-n+1 ... k. Events are in
		// bucket order, since the latest reading never goes back.
		span := func(k, n int64) (requests, retries int64) {
			lo := sort.Search(len(events), func(i int) bool { return events[i].bucket > k-n })
			for _, e := range events[lo:] {
				if e.bucket > k {
					break
				}
				if e.retry {
					retries++
				} else {
					requests++
				}
			}
			return requests, retries
		}
		window := func(k int64) (requests, retries int64) { return span(k, numBuckets) }
		// The documented decision: a retry is granted iff retries <
		// Ratio x requests + floor, that is, multiplied by 800,
		// 800 x retries < 8 x Percent x requests + 100 x Eighths x Seconds:
		// exact integers, independent of how the code rounds.
		allowed800 := func(requests int64) int64 {
			return 8*int64(p.Percent)*requests + 100*int64(p.Eighths)*int64(p.Seconds)
		}
		ceilRetries := func(requests int64) int64 { return (allowed800(requests) + 799) / 800 }
		for i, op := range s {
			arg := time.Duration(op >> 4)
			switch op % 16 {
			case 0, 1, 2, 3, 4, 5:
				b.RecordRequest()
				events = append(events, event{bucket: int64(latest) / width})
			case 6, 7, 8, 9, 10:
				k := int64(latest) / width
				requests, retries := window(k)
				want := 800*retries < allowed800(requests)
				if got := b.TryRetry(); got != want {
					t.Logf("step %d: TryRetry = %v, want %v (bucket %d, %d requests, %d retries)", i, got, want, k, requests, retries)
					return false
				}
				if want {
					events = append(events, event{bucket: k, retry: true})
					snap := b.Snapshot()
					if limit := ceilRetries(snap.Requests); snap.Retries > limit {
						t.Logf("step %d: after a grant, %d retries for %d requests, limit %v", i, snap.Retries, snap.Requests, limit)
						return false
					}
				}
			case 11, 12, 13:
				elapsed += (arg % 2000) * time.Millisecond
			case 14:
				elapsed += (arg % 60000) * time.Millisecond
			case 15:
				elapsed -= (arg % 20000) * time.Millisecond
			}
			clk.Set(epoch.Add(elapsed))
			latest = max(latest, elapsed)

			snap := b.Snapshot()
			requests, retries := window(int64(latest) / width)
			if snap.Requests != requests || snap.Retries != retries {
				t.Logf("step %d: snapshot %+v, want requests %d retries %d", i, snap, requests, retries)
				return false
			}
		}
		// The bound over every window of 10 buckets that holds an event.
		for _, e := range events {
			for k := e.bucket; k < e.bucket+numBuckets; k++ {
				_, retries := window(k)
				requests, _ := span(k, 2*numBuckets-1)
				if limit := ceilRetries(requests); retries > limit {
					t.Logf("window ending at bucket %d: %d retries for %d requests in 19 buckets, limit %v", k, retries, requests, limit)
					return false
				}
			}
		}
		return true
	}
	if err := quick.Check(check, &quick.Config{MaxCount: 300}); err != nil {
		t.Error(err)
	}
}
