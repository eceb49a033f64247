package main

import (
	"context"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/internal/incidentsim"
)

// simWidth is the slice width the simulator records; the rows shown sum
// them.
const simWidth = 50 * time.Millisecond

// simStat sums the simulator's slices in [from, to).
func simStat(r *incidentsim.Result, from, to time.Duration) sliceStat {
	w := r.Window(from, to)
	st := sliceStat{TMS: from.Milliseconds(), WidthMS: (to - from).Milliseconds(), Requests: w.Users}
	if w.Users > 0 {
		st.Success = round(w.Success(), 4)
		st.CallsPerRequest = round(w.CallsPerRequest(), 3)
	}
	return st
}

// span is one row of a simulated scenario's table: [from, to).
type span struct{ from, to time.Duration }

// spans cuts [from, to) into rows of width.
func spans(from, to, width time.Duration) []span {
	var out []span
	for t := from; t < to; t += width {
		out = append(out, span{t, min(t+width, to)})
	}
	return out
}

func recoveryMS(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}

// runLong runs the long outage in the simulator for every stack: the
// reaction in slices of 250 ms, the rest of the outage as one row, and
// the return in slices of 50 ms.
func runLong(ctx context.Context, ic incidentConfig, p progress) (sliced, error) {
	const s = time.Second
	d := ic.during
	sc := incidentsim.Long(d, ic.seed)
	back := 3*s + d
	rows := append(spans(2500*time.Millisecond, 4500*time.Millisecond, 250*time.Millisecond), span{4500 * time.Millisecond, back - 100*time.Millisecond})
	rows = append(rows, spans(back-100*time.Millisecond, back+500*time.Millisecond, simWidth)...)
	// The rest of the 3 s after, in one row: a stack that recovers later
	// than the fine rows shows it there, not only in "time to 99 %".
	rows = append(rows, span{back + 500*time.Millisecond, back + 3*s})
	out := sliced{Scenario: ic.scenario, begin: 3 * s, end: back,
		Title: fmt.Sprintf("incident simulator (simulated time, seed %d): 1000 user requests/s at order, payment down from 3 s for %v, then back for 3 s; order's client only, 3 attempts", ic.seed, d)}
	for _, st := range incidentsim.Stacks() {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		p.phase(st.Name, ic.scenario)
		r, err := incidentsim.Run(sc, st, simWidth)
		if err != nil {
			return out, err
		}
		c := column{Mode: st.Name, Incident: simStat(r, 3*s, back), First: simStat(r, 3*s, 4*s),
			RecoveryMS: recoveryMS(r.Recovery(back, back+3*s))}
		for _, sp := range rows {
			c.Slices = append(c.Slices, simStat(r, sp.from, sp.to))
		}
		out.Columns = append(out.Columns, c)
		out.legend = append(out.legend, st.Name+"\t"+stackAbout[st.Name])
	}
	out.notes = append(out.notes, "time to 99 %: from payment's return to the end of the last 50 ms slice with less than 99 % success.")
	return out, nil
}

// stackAbout says what the simulator's stacks are.
var stackAbout = map[string]string{
	"off":             "no retries",
	"retries":         "3 attempts, no protection",
	"budget+breaker":  "retry budget and circuit breaker (the recommended defaults before the adaptive throttle)",
	"adaptive+budget": "adaptive throttle and retry budget (adaptive.Config{})",
	"adaptive K=2":    "adaptive throttle with K = 2 (the SRE book's) and retry budget",
}

// runFleet runs the fleet in the simulator: one column per fleet size,
// each replica with its own adaptive throttle and budget.
func runFleet(ctx context.Context, ic incidentConfig, p progress) (sliced, error) {
	const s = time.Second
	const tail = 30 * s
	stacks := incidentsim.Stacks()
	adaptiveStack, old := stacks[3], stacks[2]
	rows := append(spans(2500*time.Millisecond, 8*s, 500*time.Millisecond), span{8 * s, 7*s + tail})
	out := sliced{Scenario: ic.scenario, begin: 3 * s, end: 7 * s,
		Title: fmt.Sprintf("incident simulator (simulated time, seed %d): replicas of order, each with its own adaptive throttle and budget (%s), sharing 1000 user requests/s; payment down from 3 s to 7 s, watched %v after", ic.seed, adaptiveStack.Name, tail)}
	oldRow := []string{"budget+breaker: outage"}
	for _, n := range ic.replicas {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		name := fmt.Sprintf("%d x %d/s", n, 1000/n)
		p.phase(name, ic.scenario)
		sc := incidentsim.Fleet(n, tail, ic.seed)
		r, err := incidentsim.Run(sc, adaptiveStack, simWidth)
		if err != nil {
			return out, err
		}
		c := column{Mode: name, Incident: simStat(r, 3*s, 7*s), First: simStat(r, 3*s, 4*s),
			RecoveryMS: recoveryMS(r.Recovery(7*s, 7*s+tail))}
		c.Floor = round(float64(n)/float64(c.Incident.Requests), 4)
		for _, sp := range rows {
			c.Slices = append(c.Slices, simStat(r, sp.from, sp.to))
		}
		sc.Faults[0].Restart = true
		rr, err := incidentsim.Run(sc, adaptiveStack, simWidth)
		if err != nil {
			return out, err
		}
		rms := recoveryMS(rr.Recovery(7*s, 7*s+tail))
		c.RestartRecoveryMS = &rms
		sc.Faults[0].Restart = false
		sc.Health = true
		rh, err := incidentsim.Run(sc, adaptiveStack, simWidth)
		if err != nil {
			return out, err
		}
		sc.Health = false
		hs, hms := simStat(rh, 3*s, 7*s), recoveryMS(rh.Recovery(7*s, 7*s+tail))
		c.Health, c.HealthRecoveryMS = &hs, &hms
		ro, err := incidentsim.Run(sc, old, simWidth)
		if err != nil {
			return out, err
		}
		oldRow = append(oldRow, cell(simStat(ro, 3*s, 7*s)))
		out.Columns = append(out.Columns, c)
	}
	out.legend = append(out.legend, "N x R/s\tN replicas of order, each seeing R of the 1000 user requests/s")
	out.extra = append(out.extra, oldRow)
	out.notes = append(out.notes,
		"floor: replicas / user requests during the outage: each replica makes at least one call to learn that payment is down.",
		"time to 99 %: from payment's return to the end of the last 50 ms slice with less than 99 % success; restart: the outage is a restart, and each replica's channel going READY again revives its throttle.",
		"a replica that sees few requests probes a dead payment with ProbeRatio (5 %) of them, so it learns late that payment is back unless its channel tells it.",
		"health watched: payment reports its own state over gRPC health checking (interceptor.WithHealth; clients use interceptor.HealthServiceConfig): NOT_SERVING after a run of its own failures, SERVING again on trial every 200 ms; the replicas' calls fail on their channels meanwhile, and a served trial makes every channel READY at once.")
	return out, nil
}
