package busy

import (
	"cmp"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
)

// Run is one run of one stack: what the load saw and what the processes
// counted.
type Run struct {
	Stack string
	Result
	Counts ChainCounts
}

// Figures summarise one run, or the median of several.
type Figures struct {
	// Requests started.
	Requests int
	// Success: OK answers over requests started.
	Success float64
	// Goodput: OK answers per second that ended in the window (by end,
	// unlike the other figures: what the chain served in it).
	Goodput float64
	// GoodputMin and GoodputMax are the lowest and highest Goodput of the
	// runs a median was taken over: the machine's noise, in the table.
	GoodputMin, GoodputMax float64
	// Runs is the number of runs summarised.
	Runs int
	// P99 of every answer; P99OK of the successes only.
	P99, P99OK time.Duration
	// Counted by the processes (zero when the stack is not stormguard's):
	// refusals (admission sheds, throttled attempts, retries denied) and
	// "down" events (targets marked down, NOT_SERVING), and each kind.
	Refusals, Admission, Throttled, RetryDenied int64
	Downs, TargetDown, NotServing               int64
	// RefusalsMax and DownsMax are the highest of the runs a median was
	// taken over: "zero in every healthy run" needs the worst run.
	RefusalsMax, DownsMax int64
	// PaymentPerRequest: calls that reached payment (every replica) per
	// request started.
	PaymentPerRequest float64
	// TierCPU: the CPU time of every tier's process per request
	// started, retries included.
	TierCPU time.Duration
	// Counted: the refusals and downs were counted: a stormguard stack
	// (its observer counts them), or none, which has nothing to refuse.
	// Other stacks' refusals (a peer's budget) are not seen.
	Counted bool
}

// figures summarises the requests of r that started in [from, to), and
// the OK answers that ended in it (the counters are the whole run's).
func figures(r Run, from, to time.Duration) Figures {
	s := r.Samples.Between(from, to)
	tot := r.Counts.Total()
	f := Figures{
		Runs:        1,
		Requests:    len(s),
		Success:     s.Success(),
		P99:         s.Percentile(0.99),
		P99OK:       ok(s).Percentile(0.99),
		Admission:   tot.AdmissionRefused(),
		Throttled:   tot.Throttled,
		Refusals:    tot.Refusals(),
		RefusalsMax: tot.Refusals(),
		Downs:       tot.Downs(),
		DownsMax:    tot.Downs(),
		TargetDown:  tot.TargetDown,
		NotServing:  tot.NotServing,
		Counted:     tot.Stormguard || r.Stack == baseline,
	}
	f.RetryDenied = tot.RetryDenied()
	if to > from {
		f.Goodput = float64(okEnded(r.Samples, from, to)) / (to - from).Seconds()
	}
	var pay int64
	for _, p := range r.Counts.Payment() {
		pay += p.Received
	}
	if n := len(r.Samples); n > 0 {
		f.PaymentPerRequest = float64(pay) / float64(n)
		f.TierCPU = time.Duration(tot.CPU / int64(n))
	}
	if r.Payment != nil && len(s) > 0 {
		// The calls that reached payment in [from, to) per request that
		// started in it, not the whole run's.
		pay = 0
		for _, a := range r.Payment {
			pay += a.In(r.Start, from, to)
		}
		f.PaymentPerRequest = float64(pay) / float64(len(s))
	}
	return f
}

// ok returns the successes of s.
func ok(s Samples) Samples {
	var o Samples
	for _, x := range s {
		if x.Code == codes.OK {
			o = append(o, x)
		}
	}
	return o
}

// okEnded counts the OK answers of s that ended in [from, to).
func okEnded(s Samples, from, to time.Duration) int {
	n := 0
	for _, x := range s {
		if end := x.Start + x.Latency; x.Code == codes.OK && end >= from && end < to {
			n++
		}
	}
	return n
}

// median returns the median of each figure over fs, each on its own
// (the median run of one column need not be that of another); for an
// even count, the lower middle.
func median(fs []Figures) Figures {
	if len(fs) == 0 {
		return Figures{}
	}
	return Figures{
		Requests:          med(fs, func(f Figures) int { return f.Requests }),
		Success:           med(fs, func(f Figures) float64 { return f.Success }),
		Goodput:           med(fs, func(f Figures) float64 { return f.Goodput }),
		GoodputMin:        slices.Min(pick(fs, func(f Figures) float64 { return f.Goodput })),
		GoodputMax:        slices.Max(pick(fs, func(f Figures) float64 { return f.Goodput })),
		Runs:              len(fs),
		P99:               med(fs, func(f Figures) time.Duration { return f.P99 }),
		P99OK:             medianOf(successP99s(fs, func(f Figures) time.Duration { return f.P99OK })),
		Refusals:          med(fs, func(f Figures) int64 { return f.Refusals }),
		RefusalsMax:       slices.Max(pick(fs, func(f Figures) int64 { return f.RefusalsMax })),
		Admission:         med(fs, func(f Figures) int64 { return f.Admission }),
		Throttled:         med(fs, func(f Figures) int64 { return f.Throttled }),
		RetryDenied:       med(fs, func(f Figures) int64 { return f.RetryDenied }),
		Downs:             med(fs, func(f Figures) int64 { return f.Downs }),
		DownsMax:          slices.Max(pick(fs, func(f Figures) int64 { return f.DownsMax })),
		TargetDown:        med(fs, func(f Figures) int64 { return f.TargetDown }),
		NotServing:        med(fs, func(f Figures) int64 { return f.NotServing }),
		PaymentPerRequest: med(fs, func(f Figures) float64 { return f.PaymentPerRequest }),
		TierCPU:           med(fs, func(f Figures) time.Duration { return f.TierCPU }),
		Counted:           fs[0].Counted,
	}
}

func med[T cmp.Ordered](fs []Figures, get func(Figures) T) T {
	return medianOf(pick(fs, get))
}

func pick[T any](fs []Figures, get func(Figures) T) []T {
	v := make([]T, len(fs))
	for i, f := range fs {
		v[i] = get(f)
	}
	return v
}

// medianOf returns the median of v (the lower middle for an even count),
// 0 for none.
func medianOf[T cmp.Ordered](v []T) T {
	var zero T
	if len(v) == 0 {
		return zero
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[(len(v)-1)/2]
}

// successP99s returns the p99s of successes of fs that have one (a run
// with no success has 0): the median of the others is the figure, not
// one pulled down by a run that had none.
func successP99s(fs []Figures, p99 func(Figures) time.Duration) []time.Duration {
	var out []time.Duration
	for _, f := range fs {
		if d := p99(f); d > 0 {
			out = append(out, d)
		}
	}
	return out
}

// Slice is one time slice of a load.
type Slice struct {
	From    time.Duration
	Success float64       // OK over requests started in the slice; -1 for none
	Goodput float64       // OK answers per second that ended in it
	P99OK   time.Duration // of the successes that started in it; 0 for none
}

// slicesOf cuts the requests of s that started in [0, length) into
// slices of width; a last slice shorter than width is left out (its
// goodput per second would read low).
func slicesOf(s Samples, width, length time.Duration) []Slice {
	var out []Slice
	for from := time.Duration(0); from+width <= length; from += width {
		in := s.Between(from, from+width)
		sl := Slice{From: from, Success: -1}
		if len(in) > 0 {
			sl.Success = in.Success()
			sl.P99OK = ok(in).Percentile(0.99)
		}
		sl.Goodput = float64(okEnded(s, from, from+width)) / width.Seconds()
		out = append(out, sl)
	}
	return out
}

// medianSlices returns, slice by slice, the median over runs.
func medianSlices(runs [][]Slice) []Slice {
	if len(runs) == 0 {
		return nil
	}
	n := len(runs[0])
	for _, r := range runs {
		n = min(n, len(r))
	}
	out := make([]Slice, n)
	for i := range n {
		var succ, good []float64
		var p99 []time.Duration
		for _, r := range runs {
			if r[i].Success >= 0 {
				succ = append(succ, r[i].Success)
			}
			good = append(good, r[i].Goodput)
			if r[i].P99OK > 0 { // a run with no success has none
				p99 = append(p99, r[i].P99OK)
			}
		}
		out[i] = Slice{From: runs[0][i].From, Success: -1, Goodput: medianOf(good), P99OK: medianOf(p99)}
		if len(succ) > 0 {
			out[i].Success = medianOf(succ)
		}
	}
	return out
}
