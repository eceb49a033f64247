package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/stormguard/stormguard/bench"
)

// fleetReplicas are the replica counts of the fleet-grpc scenario (flag
// -replicas).
var fleetReplicas = "1,10,100,1000"

// runFleet writes the tables of the fleet-grpc scenario (issue 13): N
// replicas of order share one load; payment refuses everything on its
// own for a while; without and with client-side health checking.
func runFleet(w io.Writer, seed uint64) error {
	var ns []int
	for _, f := range strings.Split(fleetReplicas, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-replicas %q: want a comma-separated list of positive counts", fleetReplicas)
		}
		ns = append(ns, n)
	}
	fp := bench.DefaultFleetParams
	fp.Seed = seed
	var runs []bench.Fleet
	t := newTable("mode", "replicas", "user requests in the outage", "calls at payment", "per request", "floor (replicas / requests)",
		"success in the outage", "user p50 / p99 in the outage", "success after", "time to 99 % (50 ms slices)", "NOT_SERVING (after back)", "trials failed: mean length", "of the calls: retries / while NOT_SERVING", "replicas served at once after the load")
	for _, h := range []bool{false, true} {
		for _, n := range ns {
			p := fp
			p.Replicas, p.Health = n, h
			r, err := bench.RunFleet(p)
			if err != nil {
				return err
			}
			runs = append(runs, r)
			calls, reqs := r.Calls(r.Begin, r.End)
			rec, ok := r.Recovery()
			back := ms(rec)
			if !ok {
				back = "> " + ms(p.After)
			}
			atOnce := 0
			for _, a := range r.Attempts {
				if a == 1 {
					atOnce++
				}
			}
			t.row(mode(h), n, reqs, calls, f3(r.PerRequest(r.Begin, r.End)), fmt.Sprintf("%.4f", r.Floor()),
				pct(r.Samples.Between(r.Begin, r.End).Success()),
				ms(r.Samples.Between(r.Begin, r.End).Percentile(0.5))+" / "+ms(r.Samples.Between(r.Begin, r.End).Percentile(0.99)), pct(r.Samples.Between(r.End, r.End+p.After).Success()),
				back, fmt.Sprintf("%d (%d)", r.Downs, r.DownsAfterBack), trials(r), fmt.Sprintf("%d / %d", r.Retries, r.WhileNotServing), fmt.Sprintf("%d / %d", atOnce, n))
		}
	}
	fmt.Fprintf(w, "### Fleet over gRPC: N replicas of order (each its own connection and interceptor.Recommended), %d req/s open-loop in all, each to a random replica, deadline %v; payment (WithHealth) refuses every call with UNAVAILABLE from %v for %v, connections ready\n\n",
		fp.Rate, fp.Deadline, fp.Healthy, fp.For)
	fmt.Fprintf(w, "Calls at payment: every call that reached payment's handler, by arrival, during the outage. Health: client-side health checking (interceptor.HealthServiceConfig). Time to 99 %%: from payment's return to the end of the last 50 ms slice (by request start) with less than 99 %% success.\n\n")
	t.write(w)

	// Slice by slice: 250 ms rows, 50 ms rows around the two changes.
	head := []string{"t (s)"}
	for _, r := range runs {
		head = append(head, fmt.Sprintf("%s %d", mode(r.Params.Health), r.Params.Replicas))
	}
	st := newTable(head...)
	total := fp.Healthy + fp.For + fp.After
	for from := time.Duration(0); from < total; {
		width := 250 * time.Millisecond
		near := func(at time.Duration) bool { return from >= at-100*time.Millisecond && from < at+500*time.Millisecond }
		if near(fp.Healthy) || near(fp.Healthy+fp.For) {
			width = fp.Fine
		}
		row := []any{fmt.Sprintf("%.2f", from.Seconds())}
		for _, r := range runs {
			row = append(row, fmt.Sprintf("%s / %s", pct(r.Samples.Between(from, from+width).Success()), f2(r.PerRequest(from, from+width))))
		}
		st.row(row...)
		from += width
	}
	fmt.Fprintf(w, "Slice by slice (250 ms; 50 ms from 0.1 s before to 0.5 s after each change): success of the user requests that started in the slice / calls at payment in the slice per user request.\n\n")
	st.write(w)
	return nil
}

// trials shows the failed trials of the outage and their mean length.
func trials(r bench.Fleet) string {
	n, mean := r.Trials()
	return fmt.Sprintf("%d: %s", n, ms(mean))
}

func mode(health bool) string {
	if health {
		return "health"
	}
	return "no health"
}
