package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// writeJSON writes the results as one JSON array, one object per mode.
func writeJSON(w io.Writer, rs []result) error {
	if rs == nil {
		rs = []result{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rs)
}

// writeTable writes the results as a table, one row per mode, with a
// header that says what was measured and a legend of the modes.
func writeTable(w io.Writer, cfg simConfig, ms []mode, rs []result) error {
	fault := "payment killed (crashed) at the start of each mode, restarted after the sustained load"
	if cfg.flaky > 0 {
		fault = fmt.Sprintf("payment failing %.0f %% of calls at random from the start of each mode, healthy again after the sustained load", cfg.flaky*100)
	}
	fmt.Fprintf(w, "stormsim: edge client -> gateway -> order -> payment, in process; %s.\n", fault)
	fmt.Fprintf(w, "one request: calls at gateway / order / payment for one user request (at payment: the attempts order sent).\n")
	fmt.Fprintf(w, "requests, calls/request (calls at payment per user request), success, p50, p99: sustained load of %d users for %v,\n", cfg.users, cfg.duration)
	fmt.Fprintf(w, "  each sending a request every %v (or when the previous one ends), with a %v deadline per request.\n", userPace, requestTimeout)
	fmt.Fprintf(w, "recovery: from payment's return until a %v window of user requests is >= %.0f %% successful (limit %v).\n\n",
		window, recoveredSuccess*100, cfg.maxRecovery)

	width := len("mode")
	for _, m := range ms {
		width = max(width, len(m.name))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\tone request\trequests\tcalls/request\tsuccess\tp50\tp99\trecovery\t\n", width, "mode")
	for _, r := range rs {
		rec := "> " + fmtDuration(cfg.maxRecovery)
		if r.RecoveryMS >= 0 {
			rec = fmtDuration(time.Duration(r.RecoveryMS) * time.Millisecond)
		}
		fmt.Fprintf(tw, "%-*s\t%d / %d / %d\t%d\t%.2f\t%.1f %%\t%s\t%s\t%s\t\n",
			width, r.Mode, r.Single.Gateway, r.Single.Order, r.Single.Payment,
			r.Sustained.Requests, r.Sustained.Amplification, r.Sustained.Success*100,
			fmtDuration(msDuration(r.Sustained.P50MS)), fmtDuration(msDuration(r.Sustained.P99MS)), rec)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, m := range ms {
		fmt.Fprintf(w, "%-*s  %s\n", width, m.name, m.about)
	}
	return nil
}

func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// fmtDuration prints d in ms below 10 s: "0.04 ms", "2.5 ms", "87 ms",
// "1180 ms", "12.3 s".
func fmtDuration(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms == 0:
		return "0 ms"
	case ms < 1:
		return fmt.Sprintf("%.2f ms", ms)
	case ms < 10:
		return fmt.Sprintf("%.1f ms", ms)
	case ms < 10000:
		return fmt.Sprintf("%.0f ms", ms)
	default:
		return fmt.Sprintf("%.1f s", ms/1000)
	}
}
