package main

import (
	"fmt"
	"io"
	"regexp"
	"time"

	"github.com/stormguard/stormguard/bench"
)

// incidents writes the tables of issue 13's incidents: success and calls
// at payment per user request, slice by slice, one column per stack.
func incidents(w io.Writer, stacks []bench.Stack, seed uint64, only *regexp.Regexp) error {
	if len(stacks) == 0 {
		return nil // -stacks matched none of them: no columns
	}
	ip := bench.DefaultIncidentParams
	for _, sc := range []struct {
		name, title string
		run         func(bench.Stack, bench.IncidentParams, uint64) (bench.Incident, error)
	}{
		{"outage-after-healthy", "Outage after healthy traffic: payment UNAVAILABLE", bench.RunOutageAfterHealthy},
		{"partial-loss", fmt.Sprintf("Partial loss: payment takes %d/s, a fifth of it", ip.Capacity), bench.RunPartialLoss},
		{"hang-after-healthy", "Hang after healthy traffic: payment holds every call until its caller's deadline", bench.RunHangAfterHealthy},
	} {
		if !only.MatchString(sc.name) {
			continue
		}
		res := make([]bench.Incident, len(stacks))
		head := []string{"t (s)"}
		for i, s := range stacks {
			r, err := sc.run(s, ip, seed)
			if err != nil {
				return err
			}
			res[i] = r
			head = append(head, s.Name)
		}
		fmt.Fprintf(w, "### %s from %v for %v, %d req/s open-loop, deadline %v\n\n", sc.title, ip.Healthy, ip.For, ip.Rate, ip.Deadline)
		fmt.Fprintf(w, "Each cell: success of the user requests that arrived in the slice / calls at payment in the slice per user request.\n\n")
		t := newTable(head...)
		for k := range res[0].Slices {
			row := []any{fmt.Sprintf("%.2f", res[0].Slices[k].Start.Seconds())}
			for _, r := range res {
				if k < len(r.Slices) {
					sl := r.Slices[k]
					row = append(row, fmt.Sprintf("%s / %s", pct(sl.Samples.Success()), f2(sl.PerRequest())))
				}
			}
			t.row(row...)
		}
		row := []any{"whole incident"}
		for _, r := range res {
			row = append(row, fmt.Sprintf("%s / %s", pct(r.Whole.Samples.Success()), f3(r.Whole.PerRequest())))
		}
		t.row(row...)
		row = []any{"first second"}
		for _, r := range res {
			first := bench.IncidentSlice{Samples: r.Whole.Samples.Between(r.Begin, r.Begin+time.Second)}
			for _, sl := range r.Slices {
				if sl.Start >= r.Begin && sl.Start < r.Begin+time.Second {
					first.Payment += sl.Payment
				}
			}
			row = append(row, fmt.Sprintf("%s / %s", pct(first.Samples.Success()), f3(first.PerRequest())))
		}
		t.row(row...)
		if sc.name == "hang-after-healthy" {
			// Nothing fails before the first deadline: what the
			// protection does shows after it.
			row = []any{"after the first deadline"}
			for _, r := range res {
				after := bench.IncidentSlice{Samples: r.Whole.Samples.Between(r.Begin+ip.Deadline, r.End)}
				for _, sl := range r.Slices {
					if sl.Start >= r.Begin+ip.Deadline && sl.Start < r.End {
						after.Payment += sl.Payment
					}
				}
				row = append(row, fmt.Sprintf("%s / %s", pct(after.Samples.Success()), f3(after.PerRequest())))
			}
			t.row(row...)
		}
		row = []any{"time to 99 % after the end"}
		for _, r := range res {
			row = append(row, backIn(r.AfterSample, r.End, r.End+ip.After))
		}
		t.row(row...)
		t.write(w)
	}
	fmt.Fprintf(w, "Time to 99 %%: from the end of the incident to the end of the last 25 ms slice (by request start) with less than 99 %% success before the load ends.\n\n")
	return nil
}

// backIn returns the time from end to the end of the last 25 ms slice of
// s, before until, with less than 99 % success.
func backIn(s bench.Samples, end, until time.Duration) string {
	d, ok := s.Recovery(end, until, 25*time.Millisecond)
	if !ok {
		return "> " + ms(until-end)
	}
	return ms(d)
}
