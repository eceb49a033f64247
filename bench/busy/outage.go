package busy

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"
)

// OutageCase is one case of scenario 5: how payment is out, the fixed
// concurrency, and the stacks.
type OutageCase struct {
	// Name is short, for the case names; Desc says what happens.
	Name, Desc string
	// Kill: payment's process is killed (SIGKILL) and started again on
	// the same address; otherwise it stays alive and answers every
	// request UNAVAILABLE (its stats port's POST /fail-all).
	Kill    bool
	Callers int
	Stacks  []string
}

// Outage is what the outage scenario's schedule did, on the load's time
// line (since Result.Start).
type Outage struct {
	// Down: payment stopped serving (no request that reaches it after
	// that is served: fail-all switched on, or its process killed).
	Down time.Duration
	// Restart: the start of its new process began (Kill; Back
	// otherwise).
	Restart time.Duration
	// Back: payment served again (fail-all switched off, or the new
	// process listened and printed its address).
	Back time.Duration
	// Payment holds the arrivals series of every payment process of the
	// run, the killed one included.
	Payment []Arrivals
}

// outageSlack lengthens the load past Back + OutageAfter: a restarted
// process needs a moment to serve.
const outageSlack = 250 * time.Millisecond

// outageLength is the length of the load of an outage run.
func (p Params) outageLength() time.Duration {
	return p.OutageBefore + p.OutageFor + p.OutageAfter + outageSlack
}

// outageDrive returns the drive of one outage run: the fixed load, and
// the schedule beside it (payment healthy for OutageBefore from the
// load's start, out for OutageFor, then healthy again).
func (h *Harness) outageDrive(v OutageCase) drive {
	p := h.Params
	return func(ctx context.Context, c *Chain) (Result, error) {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// A load that can grow runs until OutageAfter plus the slack
		// after payment is back, however late the schedule's switches
		// came (on a busy machine, the killed process's last counts took
		// half a second to read, and a new process as long to serve): it
		// runs on until the schedule has ended, which sets its length
		// (the schedule's waits are bounded by the stats and start
		// timeouts; the minute is only a bound). A load of fixed length
		// (ghz, on a machine that keeps the schedule) runs as planned,
		// and a late return leaves its last slices empty ("-").
		var length atomic.Int64
		length.Store(int64(p.outageLength() + time.Minute))
		sched := make(chan outageTimes, 1)
		go func() {
			st := runOutage(sctx, c, v.Kill, p.OutageBefore, p.OutageFor)
			end := p.outageLength()
			if st.err == nil {
				end = max(end, st.back.Sub(st.start)+p.OutageAfter+outageSlack)
			}
			length.Store(int64(end))
			sched <- st
		}()
		var res Result
		var err error
		if g, ok := h.Load.(growingLoad); ok {
			res, err = g.FixedGrowing(ctx, c.Addr(), v.Callers, &length, p.OutageDeadline)
		} else {
			res, err = h.Load.Fixed(ctx, c.Addr(), v.Callers, p.outageLength(), p.OutageDeadline)
		}
		if err != nil {
			cancel()
			<-sched
			return Result{}, err
		}
		st := <-sched
		if st.err != nil {
			return Result{}, fmt.Errorf("outage schedule: %w", st.err)
		}
		arr, err := c.PaymentArrivals(ctx)
		if err != nil {
			return Result{}, err
		}
		res.Outage = &Outage{Down: st.down.Sub(res.Start), Restart: st.restart.Sub(res.Start), Back: st.back.Sub(res.Start), Payment: arr}
		if !(res.Outage.Down > 0 && res.Outage.Back > res.Outage.Down) {
			return Result{}, fmt.Errorf("outage schedule: down at %v, back at %v of the load: not in it", res.Outage.Down, res.Outage.Back)
		}
		return res, nil
	}
}

// outageTimes are the schedule's start and switches on the wall clock.
type outageTimes struct {
	start, down, restart, back time.Time
	err                        error
}

// runOutage takes payment out after before (from its own start, which
// is the load's), for length from when it went out, and returns when
// each switch happened. The outage lasts length however long the switch
// took: a kill first reads the process's last counts, which on a busy
// machine took half a second, and an outage timed from the planned
// switch was then a few milliseconds long.
func runOutage(ctx context.Context, c *Chain, kill bool, before, length time.Duration) (o outageTimes) {
	o.start = time.Now()
	if o.err = waitUntil(ctx, o.start.Add(before)); o.err != nil {
		return o
	}
	if kill {
		o.down, o.err = c.KillPayment(ctx, 0)
	} else {
		o.down, o.err = c.FailPayment(ctx, 0, true)
	}
	if o.err != nil {
		return o
	}
	if o.err = waitUntil(ctx, o.down.Add(length)); o.err != nil {
		return o
	}
	if kill {
		o.restart, o.back, o.err = c.RestartPayment(ctx, 0)
	} else {
		o.back, o.err = c.FailPayment(ctx, 0, false)
		o.restart = o.back
	}
	return o
}

// waitUntil waits until t or until ctx ends.
func waitUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// outageWindow is a stretch of an outage run, relative to its switches.
type outageWindow struct {
	label string
	// from and to are offsets from the switch: Down (back false) or
	// Back. A window from Down ends at Back at the latest; untilBack: at
	// Back, whatever to says.
	from, to        time.Duration
	back, untilBack bool
}

// span returns the window on the run's time line.
func (w outageWindow) span(o *Outage) (from, to time.Duration) {
	switch {
	case w.back:
		return o.Back + w.from, o.Back + w.to
	case w.untilBack:
		return o.Down + w.from, o.Back
	}
	return o.Down + w.from, min(o.Down+w.to, o.Back)
}

// outageSlices are the windows of the per-slice tables: slices of
// OutageSlice from OutageShown before Down to OutageAfter after Back
// (the last one of the outage ends at Back).
func (p Params) outageSlices() []outageWindow {
	w := p.OutageSlice
	var out []outageWindow
	for from := -p.OutageShown; from < 0; from += w {
		out = append(out, outageWindow{label: "down " + offset(from), from: from, to: from + w})
	}
	for from := time.Duration(0); from < p.OutageFor; from += w {
		sl := outageWindow{label: "down " + offset(from), from: from, to: from + w}
		sl.untilBack = from+w >= p.OutageFor
		out = append(out, sl)
	}
	for from := time.Duration(0); from+w <= p.OutageAfter; from += w {
		out = append(out, outageWindow{label: "back " + offset(from), from: from, to: from + w, back: true})
	}
	return out
}

func offset(d time.Duration) string {
	if d == 0 {
		return "+0"
	}
	return fmt.Sprintf("%+.1f s", d.Seconds())
}

// outageFig is one window of one run (or the median of several).
type outageFig struct {
	success float64 // -1: no request started in it, or it is not in the load
	calls   float64 // calls at payment per request started; -1 as success
}

// outageFigure returns the success and the calls at payment per request
// of the requests that started in w.
func outageFigure(r Run, w outageWindow) outageFig {
	o := r.Outage
	from, to := w.span(o)
	if to > r.Length || to <= from {
		return outageFig{success: -1, calls: -1}
	}
	s := r.Samples.Between(from, to)
	if len(s) == 0 {
		return outageFig{success: -1, calls: -1}
	}
	var calls int64
	for _, a := range o.Payment {
		calls += a.In(r.Start, from, to)
	}
	return outageFig{success: s.Success(), calls: float64(calls) / float64(len(s))}
}

// medianOutage returns the median over runs of each window's figures.
func medianOutage(runs []Run, ws []outageWindow) []outageFig {
	out := make([]outageFig, len(ws))
	for i, w := range ws {
		var succ, calls []float64
		for _, r := range runs {
			if f := outageFigure(r, w); f.success >= 0 {
				succ, calls = append(succ, f.success), append(calls, f.calls)
			}
		}
		out[i] = outageFig{success: -1, calls: -1}
		if len(succ) > 0 {
			out[i] = outageFig{success: medianOf(succ), calls: medianOf(calls)}
		}
	}
	return out
}

// recoveryWidth is the slice of the recovery time: the time after Back
// from which every slice of it had >= 99 % success.
const recoveryWidth = 100 * time.Millisecond

// recovered returns the median over runs of the recovery time; a run
// whose last slice before OutageAfter is still below 99 % counts as
// never (+Inf, shown as "not within").
func (p Params) recovered(runs []Run) time.Duration {
	var v []time.Duration
	for _, r := range runs {
		o := r.Outage
		d, ok := r.Samples.Recovery(o.Back, min(o.Back+p.OutageAfter, r.Length), recoveryWidth)
		if !ok {
			d = math.MaxInt64
		}
		v = append(v, d)
	}
	return medianOf(v)
}

// medianOffsets returns the median over runs of Down, Back - Down and
// Back - Restart.
func medianOffsets(runs []Run) (down, out, restart time.Duration) {
	var d, o, s []time.Duration
	for _, r := range runs {
		d = append(d, r.Outage.Down)
		o = append(o, r.Outage.Back-r.Outage.Down)
		s = append(s, r.Outage.Back-r.Outage.Restart)
	}
	return medianOf(d), medianOf(o), medianOf(s)
}

// outage is scenario 5: callers at a fixed concurrency through a healthy
// chain, then payment out (failing everything, or killed), then back.
func (h *Harness) outage(ctx context.Context) error {
	p := h.Params
	grows := ""
	if _, ok := h.Load.(growingLoad); ok {
		grows = fmt.Sprintf(" (or on until %v past payment's return, when the schedule ran late)", p.OutageAfter+outageSlack)
	}
	fmt.Fprintf(h.Out, "## 5. An outage after healthy traffic\n\n"+
		"Payment serves from a pool of %d workers, each request holding one for %v (the machine is not saturated while it is healthy). "+
		"%s at a fixed concurrency, every request %s, for %v per run%s: payment healthy for %v from the load's start, then out for %v, then healthy again. "+
		"\"Down\" is when payment stopped serving, \"back\" when it served again, each as measured in the run (the tier's own clock for fail-all; for a kill, the signal and the new process's address on its stdout). "+
		"Success is by request start (a kill fails the requests in flight, which started before down); calls at payment (every process, by arrival) are per request started in the same window; refusals and downs over the whole run. "+
		"\"≥ 99 %% from\": the time after back from which every %v slice had at least 99 %% success. Each figure the median of %d interleaved runs.\n\n",
		p.Outage.Workers, p.Outage.Hold, h.Load.Name(), deadline(p.OutageDeadline), p.outageLength(), grows, p.OutageBefore, p.OutageFor, recoveryWidth, h.Runs)
	ws := p.outageSlices()
	// The windows of the summary: before the outage, in it, the two of
	// the target after it, the rest, and the first two together.
	sum := []outageWindow{
		{from: -p.OutageShown, to: 0},
		{untilBack: true},
		{from: 0, to: p.OutageSlice, back: true},
		{from: p.OutageSlice, to: 2 * p.OutageSlice, back: true},
		{from: 2 * p.OutageSlice, to: p.OutageAfter, back: true},
		{from: 0, to: 2 * p.OutageSlice, back: true},
	}
	for _, v := range p.OutageCases {
		stacks := h.stacks(v.Stacks)
		name := fmt.Sprintf("outage, %s, %d callers", v.Name, v.Callers)
		spec := func(string) ChainSpec { return ChainSpec{Payments: []Work{p.Outage}} }
		runs, err := h.runCase(ctx, name, stacks, spec, h.outageDrive(v))
		if err != nil {
			return err
		}
		down, out, restart := medianOffsets(runs[baseline])
		fmt.Fprintf(h.Out, "### 5. Outage: %s, %d callers\n\n", v.Desc, v.Callers)
		fmt.Fprintf(h.Out, "none's runs (median): down at %.2f s of the load, back %.3f s later", down.Seconds(), out.Seconds())
		if v.Kill {
			fmt.Fprintf(h.Out, " (the new process served %v after its start began)", restart.Round(time.Millisecond))
		}
		fmt.Fprint(h.Out, ".\n\n")
		t := newTable("stack", fmt.Sprintf("success: %v before", p.OutageShown), "in the outage",
			fmt.Sprintf("first %v back (target ≥ 95 %%)", p.OutageSlice), fmt.Sprintf("next %v (≥ 99 %%)", p.OutageSlice),
			fmt.Sprintf("%v-%v back", 2*p.OutageSlice, p.OutageAfter), "≥ 99 % from", "calls at payment / request: in the outage", fmt.Sprintf("first %v back", 2*p.OutageSlice), "refusals", "downs")
		whole := medianFigures(runs, 0, 0)
		for _, s := range stacks {
			f := medianOutage(runs[s], sum)
			all := whole[s]
			t.row(s, pct2(f[0].success), pct2(f[1].success), pct2(f[2].success), pct2(f[3].success), pct2(f[4].success),
				recoveredCell(p.recovered(runs[s]), p.OutageAfter), calls(f[1].calls), calls(f[5].calls), refusals(all), downs(all))
		}
		t.write(h.Out)
		h.outageSliceTable(stacks, runs, ws, "success", func(f outageFig) string { return pct(f.success) })
		h.outageSliceTable(stacks, runs, ws, "calls at payment / request", func(f outageFig) string { return calls(f.calls) })
		h.tierTable(stacks, runs)
	}
	return nil
}

// tierTable prints, for each stormguard stack, each tier's refusals and
// state changes over the run (medians, each on its own): where the
// refusals and downs of the summary come from.
func (h *Harness) tierTable(stacks []string, runs map[string][]Run) {
	var t *table
	for _, s := range stacks {
		rs := runs[s]
		if len(rs) == 0 || !rs[0].Counts.Total().Stormguard {
			continue
		}
		if t == nil {
			head := []string{"stack"}
			for _, c := range rs[0].Counts.Tiers {
				head = append(head, c.Tier)
			}
			t = newTable(head...)
		}
		row := []any{s}
		for i := range rs[0].Counts.Tiers {
			m := func(get func(Counts) int64) int64 {
				v := make([]int64, len(rs))
				for j, r := range rs {
					v[j] = get(r.Counts.Tiers[i])
				}
				return medianOf(v)
			}
			row = append(row, tierCell([]tierKind{
				{m(Counts.AdmissionRefused), "shed"},
				{m(func(c Counts) int64 { return c.Throttled }), "throttled"},
				{m(Counts.RetryDenied), "retry denied"},
				{m(func(c Counts) int64 { return c.Retries }), "retries"},
				{m(func(c Counts) int64 { return c.TargetDown }), "down"},
				{m(func(c Counts) int64 { return c.TargetUp }), "up"},
				{m(func(c Counts) int64 { return c.NotServing }), "not serving"},
				{m(func(c Counts) int64 { return c.Serving }), "serving"},
			}))
		}
		t.row(row...)
	}
	if t == nil {
		return
	}
	fmt.Fprintf(h.Out, "Per tier, over the run (medians, - for none): what its server refused (shed), what its client refused (throttled, retry denied) or retried, the times its client marked the next tier down and up again, and its server's own health (not serving, serving again):\n\n")
	t.write(h.Out)
}

type tierKind struct {
	n    int64
	name string
}

// tierCell shows the kinds that are not zero, "-" for none.
func tierCell(kinds []tierKind) string {
	var parts []string
	for _, k := range kinds {
		if k.n != 0 {
			parts = append(parts, fmt.Sprintf("%d %s", k.n, k.name))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func calls(f float64) string {
	if f < 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", f)
}

func recoveredCell(d, within time.Duration) string {
	switch d {
	case math.MaxInt64:
		return fmt.Sprintf("not within %v", within)
	case 0:
		return "0 ms"
	}
	return ms(d)
}

// outageSliceTable prints one row per stack, one column per window of
// ws, cell(median figures) in each.
func (h *Harness) outageSliceTable(stacks []string, runs map[string][]Run, ws []outageWindow, what string, cell func(outageFig) string) {
	head := []string{"stack"}
	for _, w := range ws {
		head = append(head, w.label)
	}
	t := newTable(head...)
	for _, s := range stacks {
		r := []any{s}
		for _, f := range medianOutage(runs[s], ws) {
			r = append(r, cell(f))
		}
		t.row(r...)
	}
	fmt.Fprintf(h.Out, "Per slice of %v, %s (each column starts that long after down or back; the last of the outage ends at back):\n\n", h.Params.OutageSlice, what)
	t.write(h.Out)
}
