package main

import (
	"fmt"
	"io"
	"regexp"

	"github.com/stormguard/stormguard/bench"
)

// slowOnly selects the slow scenario's stacks by name (-stacks); nil
// means all.
var slowOnly *regexp.Regexp

// runSlow runs the slow-dependency scenario for each of its stacks and
// prints the summary and the time slices.
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
	results := make([]bench.Slow, len(stacks))
	for i, s := range stacks {
		r, err := bench.RunSlow(s, p)
		if err != nil {
			return err
		}
		results[i] = r
	}
	fmt.Fprintf(w, "### Slow dependency: %d req/s open-loop; payment serves from %d workers with a FIFO queue that ignores cancellation, %v per call (%d/s), %v per call (%d/s) for %v after %v; user deadline %v\n\n",
		p.Rate, p.Workers, p.Service, int(float64(p.Workers)/p.Service.Seconds()), p.SlowService, int(float64(p.Workers)/p.SlowService.Seconds()), p.SlowFor, p.SlowBefore, p.Deadline)
	for _, s := range stacks {
		fmt.Fprintf(w, "- `%s`: %s\n", s.Name, s.Desc)
	}
	fmt.Fprintln(w)
	t := newTable("stack", "served during the slowdown / payment's capacity", "success, 1st s after", "recovery: first 1 s of 250 ms slices all >= 95 %", "success, last s", "breaker opened (edge / gw / order)")
	for i, s := range stacks {
		r := results[i]
		rec := "never"
		if d := r.Recovery(); d >= 0 {
			rec = ms(d)
		}
		t.row(s.Name, pct(r.Goodput), pct(r.After.Success()), rec, pct(r.Last.Success()), opens(s, r.Opens))
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
