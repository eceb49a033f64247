package busy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"time"
)

// Harness runs the scenarios: every figure from Runs interleaved runs
// (stack A run 1, stack B run 1, ..., stack A run 2, ...), each run on
// fresh processes.
type Harness struct {
	Launcher Launcher
	// Load is the fixed-concurrency load: Ghz, or GoLoad.
	Load FixedLoad
	// OpenConns is the open-loop load's connections to the gateway.
	OpenConns int
	// Runs per stack and case; the figures are their medians.
	Runs int
	// Stacks, if not nil, keeps only the stacks whose name matches (none,
	// retries off, always runs: every ratio is to it).
	Stacks *regexp.Regexp
	// Params size the scenarios.
	Params Params
	Seed   uint64
	// Out receives the tables; Progress, if not nil, a line per run.
	Out, Progress io.Writer
	// TierCounts: after each run, Progress also gets every tier's
	// counts (which tier refused, and why).
	TierCounts bool
	// OnCase, if not nil, receives the runs of every case, by stack.
	OnCase func(name string, runs map[string][]Run)
}

// baseline is the stack every ratio is to: retries off.
const baseline = "none"

// stacks returns the stacks of a scenario that the filter keeps, none
// first.
func (h *Harness) stacks(all []string) []string {
	out := []string{baseline}
	for _, s := range all {
		if s != baseline && (h.Stacks == nil || h.Stacks.MatchString(s)) {
			out = append(out, s)
		}
	}
	return out
}

// drive runs the load of one run on a warmed chain.
type drive func(ctx context.Context, c *Chain) (Result, error)

// runCase runs every stack Runs times, interleaved, and returns the runs
// by stack.
func (h *Harness) runCase(ctx context.Context, name string, stacks []string, spec func(stack string) ChainSpec, d drive) (map[string][]Run, error) {
	runs := map[string][]Run{}
	for r := range max(h.Runs, 1) {
		for _, s := range stacks {
			began := time.Now()
			run, err := h.once(ctx, s, spec(s), d)
			if err != nil {
				return nil, fmt.Errorf("%s, stack %s, run %d: %w", name, s, r+1, err)
			}
			runs[s] = append(runs[s], run)
			if h.Progress != nil {
				f := figures(run, 0, run.Length)
				fmt.Fprintf(h.Progress, "busy: %s, %s, run %d: %d requests, success %s, %s ok/s, refusals %d, downs %d (%v)\n",
					name, s, r+1, f.Requests, pct(f.Success), rate(f.Goodput), f.Refusals, f.Downs, time.Since(began).Round(10*time.Millisecond))
				if h.TierCounts {
					for _, t := range run.Counts.Tiers {
						fmt.Fprintf(h.Progress, "    %+v\n", t)
					}
				}
			}
		}
	}
	if h.OnCase != nil {
		h.OnCase(name, runs)
	}
	return runs, nil
}

// once starts a fresh chain, warms it, drives it and collects the
// counters.
func (h *Harness) once(ctx context.Context, stack string, spec ChainSpec, d drive) (Run, error) {
	spec.Stack = stack
	if spec.Seed == 0 {
		spec.Seed = h.Seed
	}
	c, err := StartChain(ctx, h.Launcher, spec)
	if err != nil {
		return Run{}, err
	}
	run, err := func() (Run, error) {
		if err := c.Warm(ctx); err != nil {
			return Run{}, err
		}
		res, err := d(ctx, c)
		if err != nil {
			return Run{}, err
		}
		counts, err := c.Counts(ctx)
		return Run{Stack: stack, Result: res, Counts: counts}, err
	}()
	return run, errors.Join(err, c.Close())
}

// medianFigures returns the median figures of each stack's runs over
// the requests that started in [from, to) (to 0: the load's length).
func medianFigures(runs map[string][]Run, from, to time.Duration) map[string]Figures {
	out := map[string]Figures{}
	for s, rs := range runs {
		var fs []Figures
		for _, r := range rs {
			end := to
			if end == 0 {
				end = r.Length
			}
			fs = append(fs, figures(r, from, end))
		}
		out[s] = median(fs)
	}
	return out
}

// medianSlicesOf returns each stack's median slices of width.
func medianSlicesOf(runs map[string][]Run, width time.Duration) map[string][]Slice {
	out := map[string][]Slice{}
	for s, rs := range runs {
		var all [][]Slice
		for _, r := range rs {
			all = append(all, slicesOf(r.Samples, width, r.Length))
		}
		out[s] = medianSlices(all)
	}
	return out
}
