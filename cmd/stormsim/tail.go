package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/stormguard/stormguard/hedge"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/loadgen"
	"github.com/stormguard/stormguard/internal/testsvc"
)

// scenarioTail: a healthy payment whose answers have a slow tail, with
// and without hedging.
const scenarioTail = "tail"

// The tail scenario's payment: it waits tailBase per request, and a
// share tailShare of its answers, at random, tailSlow (50 times as long).
const (
	tailBase  = 2 * time.Millisecond
	tailSlow  = 100 * time.Millisecond
	tailShare = 0.02
)

// tailMode is one stack of the tail scenario: hedges on the hops for
// which hedges reports true, Recommended on every process.
type tailMode struct {
	name, about string
	hedges      func(hop int) bool
}

var tailModes = []tailMode{
	{"retries", "interceptor.Recommended() on every process: retries, no hedges", func(int) bool { return false }},
	{"hedging", "recommended plus interceptor.WithHedging(interceptor.Hedging{}) on the edge client: a hedge after the 95th percentile of the recent first attempts, within the retry budget", func(hop int) bool { return hop == 0 }},
	{"hedging-every-hop", "recommended plus WithHedging on every hop: the edge hedges, the tiers below see its mark and do not", func(int) bool { return true }},
}

// tailRow is one mode's result, or one time slice of it.
type tailRow struct {
	Mode     string  `json:"mode"`
	StartMS  int64   `json:"start_ms,omitempty"`
	Requests int     `json:"requests"`
	Success  float64 `json:"success"`
	P50MS    float64 `json:"p50_ms"`
	P99MS    float64 `json:"p99_ms"`
	P999MS   float64 `json:"p99_9_ms"`
	// CallsPerRequest: calls at payment per user request.
	CallsPerRequest float64   `json:"calls_per_request"`
	HedgesSent      int64     `json:"hedges_sent,omitempty"`
	HedgesWon       int64     `json:"hedges_won,omitempty"`
	Slices          []tailRow `json:"slices,omitempty"`
}

func tailRowOf(mode string, s loadgen.Samples, calls int64) tailRow {
	return tailRow{
		Mode: mode, Requests: len(s), Success: round(s.Success(), 4),
		P50MS: ms(s.Percentile(0.5)), P99MS: ms(s.Percentile(0.99)), P999MS: ms(s.Percentile(0.999)),
		CallsPerRequest: round(float64(calls)/float64(max(len(s), 1)), 3),
	}
}

// hedgeCounter is an Observer that counts the hedges sent and won.
type hedgeCounter struct{ sent, won atomic.Int64 }

func (h *hedgeCounter) Observe(_ context.Context, e interceptor.Event) {
	switch e.Kind {
	case interceptor.EventHedgeSent:
		h.sent.Add(1)
	case interceptor.EventHedgeWon:
		h.won.Add(1)
	}
}

// runTailMode runs open-loop arrivals at ic.rate for ic.during against
// the chain of mode m, payment with its slow tail.
func runTailMode(ic incidentConfig, m tailMode) (tailRow, error) {
	var hc hedgeCounter
	stacks, err := buildStacks(func(hop int) (stack, error) {
		opts := append(interceptor.Recommended(), interceptor.WithObserver(&hc))
		if m.hedges(hop) {
			opts = append(opts, interceptor.WithHedging(interceptor.Hedging{}))
		}
		return slowStack(opts...)
	})
	if err != nil {
		return tailRow{}, err
	}
	chain, err := startStacks(ic.seed, stacks)
	if err != nil {
		return tailRow{}, err
	}
	defer chain.Close()
	if err := loadgen.Warm(chain); err != nil {
		return tailRow{}, err
	}
	pay := chain.Tier("payment")
	pay.SetLatency(tailBase)
	pay.SetTail(tailShare, tailSlow)
	count := func() int64 { return pay.Received(testsvc.Unary) }
	s, slices := loadgen.Sliced(chain, ic.rate, ic.during, ic.deadline, ic.slice, count, nil)
	row := tailRowOf(m.name, s, count())
	row.HedgesSent, row.HedgesWon = hc.sent.Load(), hc.won.Load()
	for _, sl := range slices {
		r := tailRowOf(m.name, sl.Samples, sl.Calls)
		r.StartMS = sl.Start.Milliseconds()
		row.Slices = append(row.Slices, r)
	}
	return row, nil
}

// tailDemo runs the tail scenario for the modes named in modesFlag
// (empty: all) and writes the table, or JSON.
func tailDemo(ctx context.Context, ic incidentConfig, modesFlag string, asJSON bool, stdout io.Writer) error {
	ms, err := parseTailModes(modesFlag)
	if err != nil {
		return err
	}
	var rows []tailRow
	for _, m := range ms {
		if err = ctx.Err(); err != nil {
			break
		}
		r, err := runTailMode(ic, m)
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		rows = append(rows, r)
	}
	return printFinished(ctx, err, len(rows), func() error {
		if asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(rows)
		}
		return writeTail(stdout, ic, ms[:len(rows)], rows)
	})
}

func parseTailModes(s string) ([]tailMode, error) {
	if s == "" {
		return tailModes, nil
	}
	var out []tailMode
	for _, name := range strings.Split(s, ",") {
		found := false
		for _, m := range tailModes {
			if m.name == strings.TrimSpace(name) {
				out, found = append(out, m), true
			}
		}
		if !found {
			return nil, fmt.Errorf("--modes: unknown mode %q for --scenario tail (want %s)", name, strings.Join(tailModeNames(), ", "))
		}
	}
	return out, nil
}

func writeTail(w io.Writer, ic incidentConfig, ms []tailMode, rows []tailRow) error {
	fmt.Fprintf(w, "stormsim --scenario tail: payment waits %v, %.0f %% of its answers (at random) %v; edge client -> gateway -> order -> payment over gRPC in process, %d user requests/s open-loop for %v, deadline %v.\n\n",
		tailBase, 100*tailShare, tailSlow, ic.rate, ic.during, ic.deadline)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\trequests\tsuccess\tp50\tp99\tp99.9\tcalls at payment / request\thedges sent\twon\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%.3f\t%d\t%d\t\n", r.Mode, r.Requests, pct(r.Success),
			fmtDuration(msDuration(r.P50MS)), fmtDuration(msDuration(r.P99MS)), fmtDuration(msDuration(r.P999MS)), r.CallsPerRequest, r.HedgesSent, r.HedgesWon)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nper %v slice (by request start): p99 / calls at payment per request\n\n", ic.slice)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "slice\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t", r.Mode)
	}
	fmt.Fprintln(tw)
	for j := range rows[0].Slices {
		fmt.Fprintf(tw, "%s\t", fmtDuration(time.Duration(rows[0].Slices[j].StartMS)*time.Millisecond))
		for _, r := range rows {
			if j < len(r.Slices) {
				fmt.Fprintf(tw, "%s / %.3f\t", fmtDuration(msDuration(r.Slices[j].P99MS)), r.Slices[j].CallsPerRequest)
			}
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, m := range ms {
		fmt.Fprintf(w, "  %-18s %s\n", m.name, m.about)
	}
	fmt.Fprintf(w, "\nthe adaptive delay hedges after %v until the target's first %d first attempts answered (hedge.Config.Initial, MinSamples): at this rate the first quarter second, whose slow answers are most of the p99.9 of a short run.\n",
		hedge.DefaultInitial, hedge.DefaultMinSamples)
	return nil
}

func tailModeNames() []string {
	names := make([]string, len(tailModes))
	for i, m := range tailModes {
		names[i] = m.name
	}
	return names
}
