package incidentsim

import (
	"fmt"
	"io"
	"math"
	"time"
)

const s = time.Second

// Outage is the outage after healthy traffic: 1000 req/s, healthy for 3 s,
// payment down for 5 s, back for 3 s.
func Outage(seed uint64) Scenario {
	return Scenario{Name: "outage after healthy load", Duration: 11 * s, Load: 1000, Seed: seed,
		Faults: []Fault{{From: 3 * s, To: 8 * s, Kind: Down}}}
}

// ColdStart is payment down from the start, for 5 s, then back for 2 s.
func ColdStart(seed uint64) Scenario {
	return Scenario{Name: "down from a cold start", Duration: 7 * s, Load: 1000, Seed: seed,
		Faults: []Fault{{From: 0, To: 5 * s, Kind: Down}}}
}

// Partial is payment at a fifth of its capacity for 2 s after 3 s
// healthy, then 3 s back.
func Partial(seed uint64) Scenario {
	return Scenario{Name: "a fifth of capacity", Duration: 8 * s, Load: 1000, Seed: seed,
		Faults: []Fault{{From: 3 * s, To: 5 * s, Kind: Capacity, Value: 0.2}}}
}

// Long is an outage of d after 3 s healthy, then 3 s back.
func Long(d time.Duration, seed uint64) Scenario {
	return Scenario{Name: fmt.Sprintf("outage of %v", d), Duration: 6*s + d, Load: 1000, Seed: seed,
		Faults: []Fault{{From: 3 * s, To: 3*s + d, Kind: Down}}}
}

// OneRequest is one user request at a dead payment from a cold start.
func OneRequest(seed uint64) Scenario {
	return Scenario{Name: "one request", Duration: s, Arrivals: []time.Duration{0}, Seed: seed,
		Faults: []Fault{{To: s, Kind: Down}}}
}

// RandomFailures is payment failing f of calls at random for 10 s.
func RandomFailures(f float64, seed uint64) Scenario {
	return Scenario{Name: fmt.Sprintf("%.0f %% random failures", f*100), Duration: 10 * s, Load: 1000, Seed: seed,
		Faults: []Fault{{From: 0, To: 10 * s, Kind: Random, Value: f}}}
}

// Hangs is payment answering nothing for 5 s after 3 s healthy, with a
// 1 s caller deadline and no per-attempt timeout, then 3 s back.
func Hangs(seed uint64) Scenario {
	return Scenario{Name: "hang until the deadline", Duration: 11 * s, Load: 1000, Seed: seed,
		Faults: []Fault{{From: 3 * s, To: 8 * s, Kind: Hang}}}
}

// Fleet is n replicas sharing 1000 req/s, healthy 3 s, payment down 4 s,
// then back for tail.
func Fleet(n int, tail time.Duration, seed uint64) Scenario {
	return Scenario{Name: fmt.Sprintf("fleet of %d", n), Duration: 7*s + tail, Load: 1000, Replicas: n, Seed: seed,
		Faults: []Fault{{From: 3 * s, To: 7 * s, Kind: Down}}}
}

func pct(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.1f %%", 100*x)
}

func num(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.3f", x)
}

func dur(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.String()
}

// sliceTable writes success and calls per request by slice of width from
// from to to, one column pair per stack.
func sliceTable(w io.Writer, sc Scenario, stacks []Stack, from, to, width time.Duration) error {
	res := make([]*Result, len(stacks))
	for i, st := range stacks {
		r, err := Run(sc, st, width)
		if err != nil {
			return err
		}
		res[i] = r
	}
	fmt.Fprintf(w, "\n%s (slices of %v; success / calls at payment per user request)\n\n| t |", sc.Name, width)
	for _, st := range stacks {
		fmt.Fprintf(w, " %s |", st.Name)
	}
	fmt.Fprint(w, "\n|---|")
	for range stacks {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	for t := from; t < to; t += width {
		fmt.Fprintf(w, "| %v |", t)
		for _, r := range res {
			sl := r.Window(t, t+width)
			fmt.Fprintf(w, " %s / %s |", pct(sl.Success()), num(sl.CallsPerRequest()))
		}
		fmt.Fprintln(w)
	}
	return nil
}

// Report writes every table of the incident simulation to w.
func Report(w io.Writer, seed uint64) error {
	stacks := Stacks()
	const ms = time.Millisecond
	// The summary: one row per target.
	fmt.Fprintf(w, "seed %d; 1000 user requests/s at order, 3 attempts, full jitter 50 ms doubling; payment answers in 2 ms\n\n", seed)
	fmt.Fprint(w, "| scenario | measure |")
	for _, st := range stacks {
		fmt.Fprintf(w, " %s |", st.Name)
	}
	fmt.Fprint(w, "\n|---|---|")
	for range stacks {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	type row struct {
		sc      Scenario
		measure string
		f       func(r *Result) string
	}
	rows := []row{
		{Outage(seed), "calls/req, first second of the outage", func(r *Result) string { return num(r.Window(3*s, 4*s).CallsPerRequest()) }},
		{Outage(seed), "calls/req, whole 5 s outage", func(r *Result) string { return num(r.Window(3*s, 8*s).CallsPerRequest()) }},
		{Outage(seed), "time to 99 % after back", func(r *Result) string { return dur(r.Recovery(8*s, 11*s)) }},
		{ColdStart(seed), "calls/req, 5 s down from cold", func(r *Result) string { return num(r.Window(0, 5*s).CallsPerRequest()) }},
		{Partial(seed), "success while at 1/5", func(r *Result) string { return pct(r.Window(3*s, 5*s).Success()) }},
		{Partial(seed), "calls/req while at 1/5", func(r *Result) string { return num(r.Window(3*s, 5*s).CallsPerRequest()) }},
		{Partial(seed), "time to 99 % after back", func(r *Result) string { return dur(r.Recovery(5*s, 8*s)) }},
		{Long(30*s, seed), "30 s: calls/req while down", func(r *Result) string { return num(r.Window(3*s, 33*s).CallsPerRequest()) }},
		{Long(30*s, seed), "30 s: time to 99 % after back", func(r *Result) string { return dur(r.Recovery(33*s, 36*s)) }},
		{Long(2*time.Minute, seed), "2 min: calls/req while down", func(r *Result) string { return num(r.Window(3*s, 123*s).CallsPerRequest()) }},
		{Long(2*time.Minute, seed), "2 min: time to 99 % after back", func(r *Result) string { return dur(r.Recovery(123*s, 126*s)) }},
		{RandomFailures(0.1, seed), "10 %: success", func(r *Result) string { return pct(r.Window(0, 10*s).Success()) }},
		{RandomFailures(0.1, seed), "10 %: calls/req", func(r *Result) string { return num(r.Window(0, 10*s).CallsPerRequest()) }},
		{RandomFailures(0.3, seed), "30 %: success", func(r *Result) string { return pct(r.Window(0, 10*s).Success()) }},
		{RandomFailures(0.3, seed), "30 %: calls/req", func(r *Result) string { return num(r.Window(0, 10*s).CallsPerRequest()) }},
		{RandomFailures(0.3, seed), "30 %: attempts refused locally", func(r *Result) string { return fmt.Sprint(r.Refused) }},
		{Hangs(seed), "calls/req over the 5 s hang", func(r *Result) string { return num(r.Window(3*s, 8*s).CallsPerRequest()) }},
		{Hangs(seed), "time to 99 % after back", func(r *Result) string { return dur(r.Recovery(8*s, 11*s)) }},
	}
	for _, rw := range rows {
		fmt.Fprintf(w, "| %s | %s |", rw.sc.Name, rw.measure)
		for _, st := range stacks {
			r, err := Run(rw.sc, st, 50*ms)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, " %s |", rw.f(r))
		}
		fmt.Fprintln(w)
	}
	// One request at a dead payment, cold.
	fmt.Fprint(w, "| one request, down, cold | calls at payment |")
	for _, st := range stacks {
		r, err := Run(OneRequest(seed), st, 50*ms)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, " %d / %d user |", r.Window(0, 2*s).Calls, r.Window(0, 2*s).Users)
	}
	fmt.Fprintln(w)

	if err := sliceTable(w, Outage(seed), stacks, 2750*ms, 4500*ms, 250*ms); err != nil {
		return err
	}
	if err := sliceTable(w, Outage(seed), stacks, 7750*ms, 8500*ms, 50*ms); err != nil {
		return err
	}
	if err := sliceTable(w, Partial(seed), stacks, 2750*ms, 5500*ms, 250*ms); err != nil {
		return err
	}
	return FleetTable(w, seed)
}

// FleetTable writes the fleet table: calls at payment per user request
// during the 4 s outage against the floor, and the time to 99 % after
// payment is back, for each stack with payment refusing everything behind
// ready channels; then for the adaptive throttle with payment's health
// watched (Scenario.Health), and when the outage is a restart whose
// channels break and reconnect.
func FleetTable(w io.Writer, seed uint64) error {
	stacks := []Stack{Stacks()[1], Stacks()[2], Stacks()[3]}
	fmt.Fprint(w, "\nfleet: replicas of order sharing 1000 req/s, payment down 4 s after 3 s healthy, watched 30 s after\n\n| replicas | req/s each | floor |")
	for _, st := range stacks {
		fmt.Fprintf(w, " %s calls/req | %s to 99 %% |", st.Name, st.Name)
	}
	fmt.Fprint(w, " adaptive+budget, health watched: calls/req | to 99 % | adaptive+budget, restart: calls/req | to 99 % |\n|---|---|---|")
	for range stacks {
		fmt.Fprint(w, "---|---|")
	}
	fmt.Fprintln(w, "---|---|---|---|")
	for _, n := range []int{1, 10, 100, 1000} {
		sc := Fleet(n, 30*s, seed)
		fmt.Fprintf(w, "| %d | %d |", n, 1000/n)
		floor := -1.0
		cell := func(sc Scenario, st Stack) error {
			r, err := Run(sc, st, 50*time.Millisecond)
			if err != nil {
				return err
			}
			out := r.Window(3*s, 7*s)
			if floor < 0 {
				floor = float64(n) / float64(out.Users)
				fmt.Fprintf(w, " %.4f |", floor)
			}
			fmt.Fprintf(w, " %s | %s |", num(out.CallsPerRequest()), dur(r.Recovery(7*s, 37*s)))
			return nil
		}
		for _, st := range stacks {
			if err := cell(sc, st); err != nil {
				return err
			}
		}
		health := sc
		health.Health = true
		if err := cell(health, stacks[2]); err != nil {
			return err
		}
		sc.Faults = []Fault{sc.Faults[0]}
		sc.Faults[0].Restart = true
		if err := cell(sc, stacks[2]); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	return nil
}
