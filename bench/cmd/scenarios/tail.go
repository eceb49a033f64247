package main

import (
	"fmt"
	"io"
	"time"

	"github.com/stormguard/stormguard/bench"
)

// runTail runs the slow-tail scenarios (payment's random slow answers;
// a slow replica among three) for each hedging stack and prints the
// latency percentiles and what they cost, against retries only.
func runTail(w io.Writer, seed uint64) error {
	stacks := tailStacks()
	if len(stacks) == 0 {
		return nil
	}
	p := bench.DefaultTailParams
	p.Seed = seed
	fmt.Fprintf(w, "### Slow tail: %d req/s open-loop for %v; payment waits %v, %.0f %% of its answers (at random) %v; user deadline %v\n\n",
		p.Rate, p.Duration, p.Base, 100*p.Share, p.Slow, p.Deadline)
	for _, s := range stacks {
		fmt.Fprintf(w, "- `%s`: %s\n", s.Name, s.Desc)
	}
	fmt.Fprintln(w)
	if err := tailTable(w, stacks, p); err != nil {
		return err
	}
	p.Replicas, p.SlowReplica = 3, 10*p.Base
	fmt.Fprintf(w, "### Slow replica: payment as %d replicas behind round_robin, each waiting %v, one %v (no random tail); %d req/s open-loop for %v\n\n",
		p.Replicas, p.Base, p.SlowReplica, p.Rate, p.Duration)
	return tailTable(w, stacks, p)
}

// tailTable runs p for each stack and prints one row each, with ratios
// to the first stack, and the p99 per time slice.
func tailTable(w io.Writer, stacks []bench.Stack, p bench.TailParams) error {
	results := make([]bench.Tail, len(stacks))
	for i, s := range stacks {
		r, err := bench.RunTail(s, p)
		if err != nil {
			return err
		}
		results[i] = r
	}
	head := []string{"stack", "success", "p50", "p90", "p99", "p99.9", "calls at payment / request", "p99 / first's", "p99.9 / first's", "calls / first's"}
	if p.Replicas > 1 {
		head = append(head, "share of calls at the slow replica")
	}
	t := newTable(head...)
	ref := results[0]
	for i, s := range stacks {
		r := results[i]
		row := []any{s.Name, pct(r.Samples.Success()),
			ms(r.Samples.Percentile(0.5)), ms(r.Samples.Percentile(0.9)), ms(r.Samples.Percentile(0.99)), ms(r.Samples.Percentile(0.999)),
			f3(r.PerRequest()),
			f2(ratio(r.Samples.Percentile(0.99), ref.Samples.Percentile(0.99))),
			f2(ratio(r.Samples.Percentile(0.999), ref.Samples.Percentile(0.999))),
			f3(r.PerRequest() / ref.PerRequest())}
		if p.Replicas > 1 {
			row = append(row, pct(float64(r.SlowCalls)/float64(max(r.Calls, 1))))
		}
		t.row(row...)
	}
	t.write(w)
	fmt.Fprintf(w, "Per %v slice (by request start): user p99 / calls at payment per request.\n\n", p.Slice)
	head = []string{"slice"}
	for _, s := range stacks {
		head = append(head, s.Name)
	}
	t = newTable(head...)
	for j := range results[0].Slices {
		row := []any{ms(results[0].Slices[j].Start)}
		for i := range stacks {
			if j >= len(results[i].Slices) {
				row = append(row, "-")
				continue
			}
			sl := results[i].Slices[j]
			row = append(row, fmt.Sprintf("%s / %.3f", ms(sl.Samples.Percentile(0.99)), sl.PerRequest()))
		}
		t.row(row...)
	}
	t.write(w)
	return nil
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(max(b, 1)) }

// runHedgeBusy runs the busy scenarios of hedging: payment at capacity
// from a fixed number of callers, and overloaded by open-loop arrivals;
// hedging must add nothing there.
func runHedgeBusy(w io.Writer, seed uint64) error {
	stacks := tailStacks()
	if len(stacks) == 0 {
		return nil
	}
	p := bench.DefaultHedgeBusyParams
	p.Seed = seed
	fmt.Fprintf(w, "### Hedging while payment is busy: %d workers at %v (%.0f/s), FIFO queue that ignores cancellation; %d callers at a fixed concurrency for %v, and open-loop arrivals at %.0fx (%.0f/s) for %v then 0.5x for %v; user deadline %v\n\n",
		p.Workers, p.Service, p.Capacity(), p.Users, p.Duration, p.Factor, p.Factor*p.Capacity(), p.Duration, p.After, p.Deadline)
	t := newTable("stack", "fixed: success", "goodput / capacity", "p99", "calls at payment / request", "open 2x: success", "goodput / capacity", "p99", "calls / request", "after: success")
	for _, s := range stacks {
		f, err := bench.RunHedgeBusy(s, p, false)
		if err != nil {
			return err
		}
		o, err := bench.RunHedgeBusy(s, p, true)
		if err != nil {
			return err
		}
		t.row(s.Name, pct(f.Samples.Success()), f2(f.Goodput()/p.Capacity()), ms(f.Samples.Percentile(0.99)),
			f3(float64(f.Calls)/float64(max(len(f.Samples), 1))),
			pct(o.Samples.Success()), f2(o.Goodput()/p.Capacity()), ms(o.Samples.Percentile(0.99)),
			f3(float64(o.Calls)/float64(max(len(o.Samples)+len(o.After), 1))), pct(o.After.Success()))
	}
	t.write(w)
	return nil
}

// tailStacks returns the hedging stacks that -stacks selects.
func tailStacks() []bench.Stack {
	var stacks []bench.Stack
	for _, s := range bench.TailStacks() {
		if slowOnly == nil || slowOnly.MatchString(s.Name) {
			stacks = append(stacks, s)
		}
	}
	return stacks
}
