package incidentsim

import (
	"fmt"
	"io"
	"time"

	"github.com/stormguard/stormguard/adaptive"
)

// Tradeoffs writes the two tables behind the targets of issue 13 that pull
// against each other: K against the partial loss (success against retries
// off, and load on the sick target) over seeds 1 to seeds, and the probe
// ratio against a fleet's load at a dead payment and its recovery.
func Tradeoffs(w io.Writer, seeds uint64) error {
	fmt.Fprintf(w, "K at a fifth of capacity (the Partial scenario, 2 s), seeds 1 to %d: mean success of retries off and of adaptive+budget with K, the worst seed's difference, mean and worst calls at payment per request\n\n", seeds)
	fmt.Fprintln(w, "| K | retries off | adaptive | worst seed, adaptive - off | calls/req mean | calls/req worst |\n|---|---|---|---|---|---|")
	for _, k := range []float64{2, 3, 4, 4.5, 5, 6} {
		var off, ad, calls, worstCalls float64
		worstDiff := 1.0
		for seed := uint64(1); seed <= seeds; seed++ {
			o, err := Run(Partial(seed), Stacks()[0], 50*time.Millisecond)
			if err != nil {
				return err
			}
			a, err := Run(Partial(seed), AdaptiveStack("k", adaptive.Config{K: k}), 50*time.Millisecond)
			if err != nil {
				return err
			}
			ow, aw := o.Window(3*s, 5*s), a.Window(3*s, 5*s)
			off += ow.Success()
			ad += aw.Success()
			calls += aw.CallsPerRequest()
			worstCalls = max(worstCalls, aw.CallsPerRequest())
			worstDiff = min(worstDiff, aw.Success()-ow.Success())
		}
		n := float64(seeds)
		fmt.Fprintf(w, "| %v | %s | %s | %+.2f pt | %.3f | %.3f |\n", k, pct(off/n), pct(ad/n), 100*worstDiff, calls/n, worstCalls)
	}

	fmt.Fprintf(w, "\nProbe ratio against fleet size (the Fleet scenario, seed 1): calls at payment per request over the 4 s outage minus the floor, and time to 99 %% after payment is back (watched 30 s)\n\n")
	sizes := []int{1, 10, 100, 1000}
	fmt.Fprint(w, "| ProbeRatio |")
	for _, n := range sizes {
		fmt.Fprintf(w, " %d x %d/s: excess | to 99 %% |", n, 1000/n)
	}
	fmt.Fprint(w, "\n|---|")
	for range sizes {
		fmt.Fprint(w, "---|---|")
	}
	fmt.Fprintln(w)
	for _, ratio := range []float64{0.02, 0.03, 0.04, 0.05, 0.07, 0.10} {
		fmt.Fprintf(w, "| %.2f |", ratio)
		for _, n := range sizes {
			r, err := Run(Fleet(n, 30*s, 1), AdaptiveStack("p", adaptive.Config{ProbeRatio: ratio}), 50*time.Millisecond)
			if err != nil {
				return err
			}
			out := r.Window(3*s, 7*s)
			fmt.Fprintf(w, " %+.3f | %s |", out.CallsPerRequest()-float64(n)/float64(out.Users), dur(r.Recovery(7*s, 37*s)))
		}
		fmt.Fprintln(w)
	}
	return nil
}
