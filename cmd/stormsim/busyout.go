package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// busyField is one column of a busy scenario's table.
type busyField struct {
	head string
	cell func(r busyRow) string
}

func pct(x float64) string { return fmt.Sprintf("%.1f %%", x*100) }

// busyFields are the columns of scenario's table.
func busyFields(r busyReport) []busyField {
	refused := func(x busyRow) string {
		if x.Refusals == nil {
			return "-"
		}
		return fmt.Sprint(x.Refusals.refused())
	}
	down := func(x busyRow) string {
		if x.Refusals == nil {
			return "-"
		}
		return fmt.Sprint(x.Refusals.downs())
	}
	none := func(x busyRow, s string) string {
		if x.Requests == 0 {
			return "-"
		}
		return s
	}
	requests := busyField{"requests", func(x busyRow) string { return fmt.Sprint(x.Requests) }}
	success := busyField{"success", func(x busyRow) string { return none(x, pct(x.Success)) }}
	okps := busyField{"ok/s", func(x busyRow) string { return fmt.Sprintf("%.0f", x.OKPerSecond) }}
	p99 := busyField{"p99", func(x busyRow) string { return none(x, fmtDuration(msDuration(x.P99MS))) }}
	tail := []busyField{{"refused", refused}, {"down", down}}
	switch r.Scenario {
	case scenarioReplicas:
		return append([]busyField{requests, success, okps, p99}, append(tail, busyField{"calls per replica", func(x busyRow) string {
			s := make([]string, len(x.CallsPerReplica))
			for i, n := range x.CallsPerReplica {
				s[i] = fmt.Sprint(n)
			}
			return strings.Join(s, " / ")
		}})...)
	case scenarioOverload:
		return append([]busyField{
			{"sent/s", func(x busyRow) string { return fmt.Sprintf("%.0f", float64(x.Requests)/(float64(x.WidthMS)/1000)) }},
			success, okps,
			{"ok/capacity", func(x busyRow) string { return fmt.Sprintf("%.2f", x.OKPerSecond/float64(r.CapacityPerSecond)) }},
			{"p99 of ok", func(x busyRow) string {
				if x.OK == 0 {
					return "-"
				}
				return fmtDuration(msDuration(x.P99OKMS))
			}},
		}, tail...)
	}
	return append([]busyField{requests, success, okps, p99}, tail...)
}

// writeBusy writes a busy scenario as tables: one row per time slice and
// mode, then each phase as a whole (for overload, one table per factor);
// then where the refusals came from, the legend and the notes.
func writeBusy(w io.Writer, r busyReport) error {
	fmt.Fprintf(w, "stormsim --scenario %s: %s.\n", r.Scenario, r.Title)
	fmt.Fprintf(w, "each row: the user requests that started in the slice (ok/s: the answers that arrived in it), per mode; * marks the incident.\n")
	fields := busyFields(r)
	for _, group := range groupByFactor(r.Columns) {
		fmt.Fprintln(w)
		if f := group[0].Factor; f > 0 {
			fmt.Fprintf(w, "%gx: %.0f arrivals/s from %.2f s for %v\n", f, f*float64(r.CapacityPerSecond), r.begin.Seconds(), r.end-r.begin)
		}
		if err := writeBusyTable(w, r, fields, group); err != nil {
			return err
		}
	}
	for i, c := range r.Columns {
		if len(c.Processes) == 0 {
			continue
		}
		if i == 0 || len(r.Columns[i-1].Processes) == 0 {
			fmt.Fprintln(w)
		}
		var all refusals
		var by, downs []string
		for _, p := range c.Processes {
			all = all.add(p.refusals)
			by = append(by, fmt.Sprintf("%s %d", p.Process, p.refused()))
			if d := p.downs(); d > 0 {
				downs = append(downs, fmt.Sprintf("%s %d", p.Process, d))
			}
		}
		name := c.Mode
		if c.Factor > 0 {
			name = fmt.Sprintf("%s at %gx", c.Mode, c.Factor)
		}
		if len(downs) == 0 {
			downs = []string{"none"}
		}
		fmt.Fprintf(w, "%s, whole run: refused %d (by process: %s; admission %d, throttle %d (%d attempts refused, %d retries denied), budget %d, breaker %d); down %s\n",
			name, all.refused(), strings.Join(by, ", "), all.Admission, all.RetryThrottled, all.Throttled, all.RetryThrottled-all.Throttled,
			all.RetryBudget, all.RetryBreaker, strings.Join(downs, ", "))
	}
	fmt.Fprintln(w)
	return writeLegend(w, r.legend, r.notes)
}

// groupByFactor splits the columns into runs of one factor, in order.
func groupByFactor(cs []busyColumn) [][]busyColumn {
	var out [][]busyColumn
	for i, c := range cs {
		if i == 0 || c.Factor != cs[i-1].Factor {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], c)
	}
	return out
}

func writeBusyTable(w io.Writer, r busyReport, fields []busyField, cs []busyColumn) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(label, mode string, x busyRow) {
		cells := []string{label, mode}
		for _, f := range fields {
			cells = append(cells, f.cell(x))
		}
		fmt.Fprintf(tw, "%s\t\n", strings.Join(cells, "\t"))
	}
	head := []string{"t (s)", "mode"}
	for _, f := range fields {
		head = append(head, f.head)
	}
	fmt.Fprintf(tw, "%s\t\n", strings.Join(head, "\t"))
	first := cs[0]
	for i, s := range first.Slices {
		l := label(sliceStat{TMS: s.TMS, WidthMS: s.WidthMS}, time.Duration(s.WidthMS)*time.Millisecond, r.begin, r.end)
		for _, c := range cs {
			row(l, c.Mode, c.Slices[i])
			l = ""
		}
	}
	for i, p := range first.Parts {
		from := time.Duration(p.TMS) * time.Millisecond
		l := fmt.Sprintf("%s %.2f-%.2f", p.Name, from.Seconds(), (from + time.Duration(p.WidthMS)*time.Millisecond).Seconds())
		for _, c := range cs {
			row(l, c.Mode, c.Parts[i].busyRow)
			l = ""
		}
	}
	return tw.Flush()
}

// writeBusyJSON writes a busy scenario as one JSON object.
func writeBusyJSON(w io.Writer, r busyReport) error {
	if r.Columns == nil {
		r.Columns = []busyColumn{}
	}
	return encodeJSON(w, r)
}
