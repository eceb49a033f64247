package bench

import (
	"time"

	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/internal/loadgen"
	"github.com/stormguard/stormguard/internal/testsvc"
)

// IncidentParams sizes the incident scenarios of issue 13: open-loop load
// at Rate per second, healthy for Healthy, then the incident for For, then
// healthy for After, reported by slices of Slice.
type IncidentParams struct {
	Rate     int
	Healthy  time.Duration
	For      time.Duration
	After    time.Duration
	Slice    time.Duration
	Deadline time.Duration
	Capacity int64 // payment's calls per second in the partial loss; a fifth of it during
}

// DefaultIncidentParams are the sizes of `make bench`.
var DefaultIncidentParams = IncidentParams{
	Rate:     300,
	Healthy:  1500 * time.Millisecond,
	For:      3 * time.Second,
	After:    1500 * time.Millisecond,
	Slice:    250 * time.Millisecond,
	Deadline: time.Second,
	Capacity: 300,
}

// IncidentSlice is what the user requests that arrived in one slice saw,
// and the calls payment received in it.
type IncidentSlice struct {
	Start   time.Duration
	Samples Samples
	Payment int64
}

// PerRequest returns the calls at payment per user request of the slice.
func (s IncidentSlice) PerRequest() float64 {
	if len(s.Samples) == 0 {
		return 0
	}
	return float64(s.Payment) / float64(len(s.Samples))
}

// Incident is the result of one incident scenario, slice by slice, with
// the slices where the incident begins and ends.
type Incident struct {
	Slices      []IncidentSlice
	Begin, End  time.Duration
	Whole       IncidentSlice // the incident as one slice
	AfterSample Samples       // requests that arrived after the incident
}

// RunOutageAfterHealthy runs the open-loop load; payment fails every call
// with UNAVAILABLE from Healthy for For.
func RunOutageAfterHealthy(stack Stack, ip IncidentParams, seed uint64) (Incident, error) {
	return runIncident(stack, ip, seed, func(pay *testsvc.Tier, on bool) {
		if on {
			pay.SetDown(codes.Unavailable)
		} else {
			pay.SetUp()
		}
	}, nil)
}

// RunHangAfterHealthy runs the open-loop load; payment holds every call
// until its caller gives up (a latency of an hour that ends with the
// call's context) from Healthy for For.
func RunHangAfterHealthy(stack Stack, ip IncidentParams, seed uint64) (Incident, error) {
	return runIncident(stack, ip, seed, func(pay *testsvc.Tier, on bool) {
		if on {
			pay.SetLatency(time.Hour)
		} else {
			pay.SetLatency(0)
		}
	}, nil)
}

// RunPartialLoss runs the open-loop load; payment takes ip.Capacity calls
// per second, a fifth of it from Healthy for For, and sheds the rest with
// UNAVAILABLE.
func RunPartialLoss(stack Stack, ip IncidentParams, seed uint64) (Incident, error) {
	return runIncident(stack, ip, seed, func(pay *testsvc.Tier, on bool) {
		c := ip.Capacity
		if on {
			c = max(c/5, 1)
		}
		pay.SetCapacity(testsvc.Capacity{PerSecond: c})
	}, func(pay *testsvc.Tier) {
		pay.SetCapacity(testsvc.Capacity{PerSecond: ip.Capacity})
		// Start on a second boundary, so that the loss starts and ends
		// on boundaries of payment's per-second counter.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	})
}

func runIncident(stack Stack, ip IncidentParams, seed uint64, fault func(pay *testsvc.Tier, on bool), setup func(pay *testsvc.Tier)) (Incident, error) {
	c, _, err := start(stack, seed)
	if err != nil {
		return Incident{}, err
	}
	defer c.Close()
	pay := c.Tier("payment")
	if setup != nil {
		setup(pay)
	}
	begin, end := ip.Healthy, ip.Healthy+ip.For
	total := end + ip.After
	s, slices := loadgen.Sliced(c, ip.Rate, total, ip.Deadline, ip.Slice, func() int64 { return unary(pay) }, []loadgen.Step{
		{At: begin, Do: func() { fault(pay, true) }},
		{At: end, Do: func() { fault(pay, false) }},
	})
	r := Incident{Begin: begin, End: end}
	for _, sl := range slices {
		r.Slices = append(r.Slices, IncidentSlice{Start: sl.Start, Samples: sl.Samples, Payment: sl.Calls})
	}
	whole := loadgen.Sum(slices, begin, end)
	r.Whole = IncidentSlice{Start: begin, Samples: s.Between(begin, end), Payment: whole.Calls}
	r.AfterSample = s.Between(end, total)
	return r, nil
}
