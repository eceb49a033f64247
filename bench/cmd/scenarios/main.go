// Command scenarios runs every fault scenario against every retry stack
// on the gateway -> order -> payment chain, in one run, and prints the
// results as markdown tables.
//
//	go run ./cmd/scenarios              # from bench/
//	go run ./cmd/scenarios -stacks 'stormguard|none' -scenarios flaky
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/stormguard/stormguard/bench"
)

func main() {
	stacksRE := flag.String("stacks", "", "run only the stacks whose name matches this regexp")
	scenRE := flag.String("scenarios", "", "run only the scenarios whose name matches this regexp: down-one, down-sustained, flaky, capacity, kill, outage-after-healthy, partial-loss, hang-after-healthy, slow, tail, hedge-busy, fleet-grpc")
	flag.StringVar(&fleetReplicas, "replicas", fleetReplicas, "fleet-grpc: the replica counts, comma-separated")
	seed := flag.Uint64("seed", bench.DefaultParams.Seed, "seed of the random faults")
	flag.Parse()
	sre, err := regexp.Compile(*stacksRE)
	if err != nil {
		fail(err)
	}
	cre, err := regexp.Compile(*scenRE)
	if err != nil {
		fail(err)
	}
	slowOnly = sre
	var stacks []bench.Stack
	for _, s := range bench.Stacks() {
		if sre.MatchString(s.Name) {
			stacks = append(stacks, s)
		}
	}
	p := bench.DefaultParams
	p.Seed = *seed
	if err := run(os.Stdout, stacks, p, cre); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scenarios:", err)
	os.Exit(1)
}

func run(w io.Writer, stacks []bench.Stack, p bench.Params, only *regexp.Regexp) error {
	began := time.Now()
	fmt.Fprintf(w, "## Scenarios: gateway -> order -> payment over bufconn\n\n")
	fmt.Fprintf(w, "%s/%s, GOMAXPROCS %d, %s, seed %d, %s\n\n", runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.Version(), p.Seed, began.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "Stacks (installed on every hop; server interceptors, where the stack has them, on every tier):\n\n")
	for _, s := range stacks {
		fmt.Fprintf(w, "- `%s`: %s\n", s.Name, s.Desc)
	}
	fmt.Fprintln(w)

	if only.MatchString("down-one") {
		t := newTable("stack", "calls at gateway", "at order", "at payment", "user got", "user latency")
		for _, s := range stacks {
			r, err := bench.RunDownOne(s, p)
			if err != nil {
				return err
			}
			t.row(s.Name, r.Received[0], r.Received[1], r.Received[2], r.Code, ms(r.Latency))
		}
		fmt.Fprintf(w, "### Payment down, one user request\n\n")
		t.write(w)
	}

	if only.MatchString("down-sustained") {
		t := newTable("stack", "user requests", "success", "calls at payment / request", "user p50", "user p99", "breaker opened (edge / gw / order)")
		for _, s := range stacks {
			r, err := bench.RunDownSustained(s, p)
			if err != nil {
				return err
			}
			t.row(s.Name, len(r.Samples), pct(r.Samples.Success()), f3(r.PerRequest()),
				ms(r.Samples.Percentile(0.5)), ms(r.Samples.Percentile(0.99)), opens(s, r.Opens))
		}
		fmt.Fprintf(w, "### Payment down, sustained: %d closed-loop users for %v, deadline %v per request\n\n", p.Users, p.DownFor, p.Deadline)
		t.write(w)
	}

	if only.MatchString("flaky") {
		for _, prob := range []float64{0.1, 0.3} {
			t := newTable("stack", "success", "calls at payment / request", "user p50", "user p99", "breaker opened (edge / gw / order)")
			for _, s := range stacks {
				r, err := bench.RunFlaky(s, p, prob)
				if err != nil {
					return err
				}
				t.row(s.Name, pct(r.Samples.Success()), f3(r.PerRequest()),
					ms(r.Samples.Percentile(0.5)), ms(r.Samples.Percentile(0.99)), opens(s, r.Opens))
			}
			fmt.Fprintf(w, "### Payment fails %.0f %% at random (seeded): %d requests from %d closed-loop users\n\n", prob*100, p.FlakyRequests, p.Users)
			t.write(w)
		}
	}

	if only.MatchString("capacity") {
		t := newTable("stack", "before: success", "calls/req", "during: success", "calls/req", "p99", "after: success", "calls/req", "breaker opened (edge / gw / order)")
		for _, s := range stacks {
			r, err := bench.RunCapacityDrop(s, p)
			if err != nil {
				return err
			}
			t.row(s.Name,
				pct(r.Before.Samples.Success()), f2(r.Before.PerRequest()),
				pct(r.During.Samples.Success()), f2(r.During.PerRequest()), ms(r.During.Samples.Percentile(0.99)),
				pct(r.After.Samples.Success()), f2(r.After.PerRequest()), opens(s, r.Opens))
		}
		fmt.Fprintf(w, "### Capacity drop: %d req/s open-loop; payment takes %d/s, %d/s for %v after %v, then %d/s for %v; deadline %v\n\n",
			p.Rate, p.Capacity, max(p.Capacity/5, 1), p.CapDuring, p.CapBefore, p.Capacity, p.CapAfter, p.CapDeadline)
		t.write(w)
	}

	if only.MatchString("kill") {
		t := newTable("stack", "success while killed", "attempts at payment / request while killed", "user p99 while killed", "recovery to >= 99 %", "breaker opened (edge / gw / order)")
		for _, s := range stacks {
			r, err := bench.RunKillRestart(s, p)
			if err != nil {
				return err
			}
			rec := fmt.Sprintf("> %v", p.KillWatch-time.Second)
			if r.Recovery >= 0 {
				rec = ms(r.Recovery)
			}
			per := 0.0
			if len(r.Killed) > 0 {
				per = float64(r.Attempts) / float64(len(r.Killed))
			}
			t.row(s.Name, pct(r.Killed.Success()), f2(per), ms(r.Killed.Percentile(0.99)), rec, opens(s, r.Opens))
		}
		fmt.Fprintf(w, "### Kill and restart: %d closed-loop users, deadline %v; payment killed after %v, restarted %v later\n\n",
			p.KillUsers, p.KillDeadline, p.KillWarmup, p.KillFor)
		fmt.Fprintf(w, "Recovery: from the restart to the first 100 ms bucket (by request start) that begins a run of 10 buckets each with >= 99 %% success.\n\n")
		t.write(w)
	}
	if err := incidents(w, stacks, p.Seed, only); err != nil {
		return err
	}
	if only.MatchString("slow") {
		if err := runSlow(w, p.Seed); err != nil {
			return err
		}
	}
	if only.MatchString("tail") {
		if err := runTail(w, p.Seed); err != nil {
			return err
		}
	}
	if only.MatchString("hedge-busy") {
		if err := runHedgeBusy(w, p.Seed); err != nil {
			return err
		}
	}
	if only.MatchString("fleet-grpc") {
		if err := runFleet(w, p.Seed); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "Scenario run took %v.\n", time.Since(began).Round(time.Second))
	return nil
}

// opens shows breaker openings per hop: edge / gateway / order client.
func opens(s bench.Stack, n [3]int64) string {
	if !s.HasBreaker {
		return "-"
	}
	return fmt.Sprintf("%d / %d / %d", n[0], n[1], n[2])
}

func pct(f float64) string { return fmt.Sprintf("%.2f %%", 100*f) }
func f2(f float64) string  { return fmt.Sprintf("%.2f", f) }
func f3(f float64) string  { return fmt.Sprintf("%.3f", f) }
func ms(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	}
}

type table struct {
	head []string
	rows [][]string
}

func newTable(head ...string) *table { return &table{head: head} }

func (t *table) row(cells ...any) {
	r := make([]string, len(cells))
	for i, c := range cells {
		r[i] = fmt.Sprint(c)
	}
	t.rows = append(t.rows, r)
}

func (t *table) write(w io.Writer) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(t.head, " | "))
	sep := make([]string, len(t.head))
	for i := range sep {
		sep[i] = "---"
		if i > 0 {
			sep[i] = "---:"
		}
	}
	fmt.Fprintf(w, "|%s|\n", strings.Join(sep, "|"))
	for _, r := range t.rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
	fmt.Fprintln(w)
}
