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
	return encodeJSON(w, rs)
}

// encodeJSON writes v as indented JSON, the form of every -json output.
func encodeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeTable writes the results as two tables, one row per mode each:
// the calls one request causes and the sustained open loop, then the
// closed-loop users and the recovery; a header says what was measured,
// and a legend of the modes follows.
func writeTable(w io.Writer, cfg simConfig, ms []mode, rs []result) error {
	fault := "payment killed (crashed) at the start of each mode, restarted after the load"
	if cfg.flaky > 0 {
		fault = fmt.Sprintf("payment failing %.0f %% of calls at random from the start of each mode, healthy again after the load", cfg.flaky*100)
	}
	fmt.Fprintf(w, "stormsim: edge client -> gateway -> order -> payment, in process; %s.\n", fault)
	fmt.Fprintf(w, "one request: calls at gateway / order / payment for one user request (at payment: the attempts order sent).\n")
	fmt.Fprintf(w, "%d req/s: then %d user requests a second for %v, open loop: each leaves on time, whatever the answers (users arriving),\n",
		cfg.rate, cfg.rate, cfg.duration)
	fmt.Fprintf(w, "  with a %v deadline; requests sent, calls at payment per second of sending and per request, success, p50, p99.\n\n", requestTimeout)

	width := len("mode")
	for _, m := range ms {
		width = max(width, len(m.name))
	}
	row := func(tw io.Writer, s phaseStats) {
		fmt.Fprintf(tw, "%d\t%.0f\t%.2f\t%.1f %%\t%s\t%s\t", s.Requests, s.CallsPerSecond, s.Amplification, s.Success*100,
			fmtDuration(msDuration(s.P50MS)), fmtDuration(msDuration(s.P99MS)))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\tone request\trequests\tcalls/s\tcalls/request\tsuccess\tp50\tp99\t\n", width, "mode")
	for _, r := range rs {
		fmt.Fprintf(tw, "%-*s\t%d / %d / %d\t", width, r.Mode, r.Single.Gateway, r.Single.Order, r.Single.Payment)
		row(tw, r.Sustained)
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\n%d users: then %d users for %v, closed loop: each sends a request every %v, or when its previous one ends\n",
		cfg.users, cfg.users, cfg.usersFor, userPace)
	fmt.Fprintf(w, "  (a user waits for the answer), with the same deadline and columns.\n")
	fmt.Fprintf(w, "recovery: payment back, the same users: from its return until a %v window of user requests is >= %.0f %% successful (limit %v).\n\n",
		window, recoveredSuccess*100, cfg.maxRecovery)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\trequests\tcalls/s\tcalls/request\tsuccess\tp50\tp99\trecovery\t\n", width, "mode")
	for _, r := range rs {
		rec := "> " + fmtDuration(cfg.maxRecovery)
		if r.RecoveryMS >= 0 {
			rec = fmtDuration(time.Duration(r.RecoveryMS) * time.Millisecond)
		}
		fmt.Fprintf(tw, "%-*s\t", width, r.Mode)
		row(tw, r.ClosedLoop)
		fmt.Fprintf(tw, "%s\t\n", rec)
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
