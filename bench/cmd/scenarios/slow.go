package main

import (
	"cmp"
	"fmt"
	"io"
	"regexp"
	"slices"

	"github.com/stormguard/stormguard/bench"
)

// slowOnly selects the slow scenario's stacks by name (-stacks); nil
// means all.
var slowOnly *regexp.Regexp

// slowRuns is how many times each stack runs the slow scenario,
// interleaved. Its slowdown is 1 s of 80 calls at payment, so one run's
// served share moves by several points with the timing of the first
// few calls into the slowdown (the recommended stack's single runs read
// 58.75 % to 92.50 % in one day, about 86 % in the median): the table
// shows the median run and the range.
const slowRuns = 5

// runSlow runs the slow-dependency scenario slowRuns times for each of
// its stacks, interleaved, and prints each stack's median run (by the
// share served) with the range of the shares, and the median runs' time
// slices.
func runSlow(w io.Writer, seed uint64) error {
	p := bench.DefaultSlowParams
	p.Seed = seed
	var stacks []bench.Stack
	for _, s := range bench.SlowStacks(p) {
		if slowOnly == nil || slowOnly.MatchString(s.Name) {
			stacks = append(stacks, s)
		}
	}
	if len(stacks) == 0 {
		return nil
	}
	runs := make([][]bench.Slow, len(stacks))
	for k := range slowRuns {
		q := p
		q.Seed = seed + uint64(k)
		for i, s := range stacks {
			r, err := bench.RunSlow(s, q)
			if err != nil {
				return err
			}
			runs[i] = append(runs[i], r)
		}
	}
	results := make([]bench.Slow, len(stacks))
	for i, rs := range runs {
		results[i] = medianSlow(rs)
	}
	fmt.Fprintf(w, "### Slow dependency: %d req/s open-loop; payment serves from %d workers with a FIFO queue that ignores cancellation, %v per call (%d/s), %v per call (%d/s) for %v after %v; user deadline %v\n\n",
		p.Rate, p.Workers, p.Service, int(float64(p.Workers)/p.Service.Seconds()), p.SlowService, int(float64(p.Workers)/p.SlowService.Seconds()), p.SlowFor, p.SlowBefore, p.Deadline)
	for _, s := range stacks {
		fmt.Fprintf(w, "- `%s`: %s\n", s.Name, s.Desc)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Each stack's median of %d interleaved runs by the share served (its other columns and its slices are that run's); the range is every run's share.\n\n", slowRuns)
	t := newTable("stack", "served during the slowdown / payment's capacity: median (range)", "success, 1st s after", "recovery: first 1 s of 250 ms slices all >= 95 %", "success, last s", "breaker opened (edge / gw / order)")
	for i, s := range stacks {
		r := results[i]
		rec := "never"
		if d := r.Recovery(); d >= 0 {
			rec = ms(d)
		}
		rs := runs[i] // sorted by medianSlow
		t.row(s.Name, fmt.Sprintf("%s (%s-%s)", pct(r.Goodput), pct(rs[0].Goodput), pct(rs[len(rs)-1].Goodput)), pct(r.After.Success()), rec, pct(r.Last.Success()), opens(s, r.Opens))
	}
	t.write(w)
	fmt.Fprintf(w, "Per %v slice (by request start; the slowdown is from %v to %v): user success %% / calls at payment / calls payment's workers finished.\n\n", p.Slice, ms(results[0].SlowAt), ms(results[0].BackAt))
	head := []string{"slice"}
	for _, s := range stacks {
		head = append(head, s.Name)
	}
	t = newTable(head...)
	for j := range results[0].Slices {
		row := []any{ms(results[0].Slices[j].From)}
		for i := range stacks {
			sl := results[i].Slices[j]
			row = append(row, fmt.Sprintf("%.0f %% / %d / %d", 100*sl.Samples.Success(), sl.Payment, sl.Served))
		}
		t.row(row...)
	}
	t.write(w)
	return nil
}

// medianSlow sorts runs by the share served and returns the median one
// (the upper of the two middle ones for an even count). runs is not
// empty.
func medianSlow(runs []bench.Slow) bench.Slow {
	slices.SortFunc(runs, func(a, b bench.Slow) int { return cmp.Compare(a.Goodput, b.Goodput) })
	return runs[len(runs)/2]
}
