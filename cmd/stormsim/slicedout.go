package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// cell prints a span as "success / calls per request".
func cell(s sliceStat) string {
	if s.Requests == 0 {
		return "- / -"
	}
	return fmt.Sprintf("%.1f %% / %.2f", s.Success*100, s.CallsPerRequest)
}

// label prints a row's span: its start in seconds, or start-end for a
// longer row, with "*" when it lies in the incident.
func label(s sliceStat, width time.Duration, begin, end time.Duration) string {
	from := time.Duration(s.TMS) * time.Millisecond
	to := from + time.Duration(s.WidthMS)*time.Millisecond
	l := fmt.Sprintf("%.2f", from.Seconds())
	if width > 0 && to-from > width {
		l = fmt.Sprintf("%.2f-%.2f", from.Seconds(), to.Seconds())
	}
	if from >= begin && from < end {
		l += " *"
	}
	return l
}

// writeSliced writes a sliced scenario as a table: one row per time
// slice, one column per mode, then the incident as a whole.
func writeSliced(w io.Writer, r sliced) error {
	fmt.Fprintf(w, "stormsim --scenario %s: %s.\n", r.Scenario, r.Title)
	fmt.Fprintf(w, "each cell: success of the user requests that started in the slice / calls at payment in the slice per user request; * marks the incident.\n\n")
	if len(r.Columns) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{"t (s)"}
	for _, c := range r.Columns {
		head = append(head, c.Mode)
	}
	row := func(cells []string) { fmt.Fprintf(tw, "%s\t\n", strings.Join(cells, "\t")) }
	row(head)
	first := r.Columns[0]
	var width time.Duration
	if len(first.Slices) > 0 {
		width = time.Duration(first.Slices[0].WidthMS) * time.Millisecond
	}
	for i, s := range first.Slices {
		cells := []string{label(s, width, r.begin, r.end)}
		for _, c := range r.Columns {
			cells = append(cells, cell(c.Slices[i]))
		}
		row(cells)
	}
	summary := func(name string, f func(c column) string) {
		cells := []string{name}
		for _, c := range r.Columns {
			cells = append(cells, f(c))
		}
		row(cells)
	}
	summary("whole incident", func(c column) string { return cell(c.Incident) })
	summary("its first second", func(c column) string { return cell(c.First) })
	summary("time to 99 % after", func(c column) string { return recoveryText(c.RecoveryMS) })
	if first.Floor > 0 {
		summary("floor (calls/request)", func(c column) string { return fmt.Sprintf("%.4f", c.Floor) })
	}
	if first.RestartRecoveryMS != nil {
		summary("restart: time to 99 %", func(c column) string { return recoveryText(*c.RestartRecoveryMS) })
	}
	if first.Health != nil {
		summary("health watched: outage", func(c column) string { return cell(*c.Health) })
		summary("health watched: time to 99 %", func(c column) string { return recoveryText(*c.HealthRecoveryMS) })
	}
	for _, e := range r.extra {
		row(e)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return writeLegend(w, r.legend, r.notes)
}

func recoveryText(ms int64) string {
	if ms < 0 {
		return "not in the run"
	}
	return fmtDuration(time.Duration(ms) * time.Millisecond)
}

// writeSlicedJSON writes a sliced scenario as one JSON object.
func writeSlicedJSON(w io.Writer, r sliced) error {
	if r.Columns == nil {
		r.Columns = []column{}
	}
	return encodeJSON(w, r)
}

// writeLegend writes a table's legend ("name\twhat it is" lines, aligned)
// and its notes.
func writeLegend(w io.Writer, legend, notes []string) error {
	lw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, l := range legend {
		fmt.Fprintln(lw, l)
	}
	if err := lw.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	return nil
}
