// Command stormsim is the demo of stormguard: it kills the payment service
// of an edge -> gateway -> order -> payment chain and counts, mode by mode,
// what every tier's retries do to it.
//
//	stormsim [flags]              the demo, in process (the default)
//	stormsim serve --tier T ...   one tier of the chain as a process of its own
//	stormsim load --target A ...  drive a gateway process and watch each tier
//
// Run "stormsim -h", "stormsim serve -h" or "stormsim load -h" for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go quitOnSecondSignal(ctx, stop, os.Stderr)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if errors.Is(err, errInterrupted) {
		fmt.Fprintln(os.Stderr, "stormsim:", err)
		os.Exit(130) // as a shell reports a process ended by Ctrl-C
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "stormsim:", err)
		os.Exit(1)
	}
}

// quitOnSecondSignal waits for the first Ctrl-C (ctx done), says that
// what has finished is printed once the run in progress stops (the
// demo's stops at once; a scenario's ends by itself, after its phases;
// serve and load stop at once), and gives the signals back, so that a
// second Ctrl-C ends the process. It returns when ctx is done, as at the
// end of main.
func quitOnSecondSignal(ctx context.Context, stop func(), stderr io.Writer) {
	<-ctx.Done()
	stop()
	if context.Cause(ctx) != context.Canceled { // a signal, not main's own stop
		fmt.Fprintln(stderr, "stormsim: interrupted: printing what has finished once the run in progress stops (Ctrl-C again to quit now)")
	}
}

// shortUsage makes fs print its usage, through full, only when asked
// (-h, -help); a bad flag is reported once, by parseFlags' error, which
// says where the flags are, instead of above a page of usage that
// scrolls it away.
func shortUsage(fs *flag.FlagSet, args []string, stderr io.Writer, full func()) {
	asked := slices.ContainsFunc(args, func(a string) bool {
		switch a {
		case "-h", "--h", "-help", "--help":
			return true
		}
		return false
	})
	fs.SetOutput(io.Discard) // the flag package's own error line: parseFlags returns it
	fs.Usage = func() {
		if asked {
			fs.SetOutput(stderr) // for full's PrintDefaults
			full()
			fs.SetOutput(io.Discard)
		}
	}
}

// parseFlags parses args into fs (set up by shortUsage): flag.ErrHelp
// after -h, or an error that names the bad flag and where the flags are.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return fmt.Errorf("%w (run '%s -h' for the flags)", err, fs.Name())
}

// errInterrupted ends a demo or scenario that a Ctrl-C stopped, after
// what finished before it is printed; main exits with status 130.
var errInterrupted = errors.New("interrupted")

// printFinished prints the results of a run that err ended, through
// print: all of them when err is nil; when an interrupt (ctx done)
// stopped it after n runs finished, those, and then it returns
// errInterrupted; any other error is returned as it is, with nothing
// printed.
func printFinished(ctx context.Context, err error, n int, print func() error) error {
	stopped := err != nil && ctx.Err() != nil
	switch {
	case err != nil && !stopped:
		return err
	case stopped && n == 0:
		return errInterrupted
	}
	if err := print(); err != nil {
		return err
	}
	if stopped {
		return errInterrupted
	}
	return nil
}

// run runs the subcommand that args name, or the demo.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "serve":
			return serve(ctx, args[1:], stdout, stderr)
		case "load":
			return load(ctx, args[1:], stdout, stderr)
		}
	}
	return demo(ctx, args, stdout, stderr)
}

// killRate is the open-loop rate of the demo's sustained phase: the
// seed's payment, which expects 200 requests a second.
const killRate = 200

// maxRate bounds --rate.
const maxRate = 10000

// isSet reports whether the flag name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// demo runs every mode in process and prints the table (or JSON) and
// writes the chart.
func demo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stormsim", flag.ContinueOnError)
	shortUsage(fs, args, stderr, func() {
		fmt.Fprintf(stderr, "Usage: stormsim [flags]\n       stormsim serve -h\n       stormsim load -h\n\n"+
			"Kills the payment service of an in-process gateway -> order -> payment chain and counts,\n"+
			"for each mode, the calls one user request causes, what sustained load does (--rate\n"+
			"requests a second, sent whatever the answers; then --users users, each waiting for its\n"+
			"answer), and how long users need to succeed again once payment is back.\n\nModes:\n")
		for _, m := range modes {
			fmt.Fprintf(stderr, "  %-11s  %s\n", m.name, m.about)
		}
		fmt.Fprintf(stderr, "\nScenarios (--scenario):\n")
		for _, sc := range scenarios {
			fmt.Fprintf(stderr, "  %-11s  %s\n", sc.name, sc.about)
		}
		fmt.Fprintf(stderr, "\n--scenario slow has its own modes: %s; --scenario tail too: %s.\n", strings.Join(slowModeNames(), ", "), strings.Join(tailModeNames(), ", "))
		fmt.Fprintf(stderr, "--scenario capacity, replicas and overload run %s by default; --modes takes %q (no interceptor, no retries) and the modes above.\n",
			strings.Join(busyDefaultModes, ", "), offMode.name)
		fmt.Fprintf(stderr, "\nFlags:\n")
		fs.PrintDefaults()
	})
	modesFlag := fs.String("modes", strings.Join(modeNames(), ","), "comma-separated `modes` to run, in order")
	duration := fs.Duration("duration", 2*time.Second, "length of the sustained phase of each mode, --rate requests a second (open loop)")
	users := fs.Int("users", 32, "users in the closed-loop phase after the sustained one, and in the recovery phase; capacity, replicas: callers at a fixed concurrency (64 unless given)")
	usersFor := fs.Duration("users-for", time.Second, "length of the closed-loop phase of --users users")
	flaky := fs.Float64("flaky", 0, "instead of killing payment, make it fail each call with `probability` p in (0, 1]; 0 kills it; capacity: payment's failure probability after the healthy part (0.1 unless given)")
	seed := fs.Uint64("seed", 1, "seed of the random faults")
	asJSON := fs.Bool("json", false, "print JSON instead of the tables: for kill and tail an array, one object per mode; for the other scenarios one object (scenario, title, columns: one per mode, with its slices)")
	chart := fs.String("chart", "", "write the chart of calls per second at payment, one panel per mode, to `path` (.svg, .png, .pdf, ...); none by default")
	maxRecovery := fs.Duration("max-recovery", 8*time.Second, "how long to wait for recovery after payment is back")
	scenario := fs.String("scenario", scenarioKill, "the incident: "+strings.Join(scenarioNames(), ", ")+" (see above)")
	inc := incidentFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (subcommands: serve, load)", fs.Arg(0))
	}
	if err := checkScenarioFlags(fs, *scenario); err != nil {
		return err
	}
	if isSet(fs, "rate") && (*inc.rate < 1 || *inc.rate > maxRate) {
		return fmt.Errorf("--rate %d: want 1 to %d user requests per second", *inc.rate, maxRate)
	}
	inc.users, inc.usersSet = users, isSet(fs, "users")
	inc.flaky, inc.flakySet = flaky, isSet(fs, "flaky")
	inc.given = func(name string) bool { return isSet(fs, name) }
	if *scenario != scenarioKill {
		mf := *modesFlag
		if !isSet(fs, "modes") {
			mf = "" // the scenario's own default
		}
		return incidentDemo(ctx, *scenario, mf, *seed, *asJSON, inc, stdout, stderr)
	}
	ms, err := parseModes(*modesFlag)
	if err != nil {
		return err
	}
	rate := killRate
	if isSet(fs, "rate") {
		rate = *inc.rate
	}
	switch {
	case *users < 1 || *users > 10000:
		return fmt.Errorf("--users %d: want 1 to 10000", *users)
	case *duration <= 0 || *duration > time.Hour:
		return fmt.Errorf("--duration %v: want more than 0, at most 1h", *duration)
	case *usersFor <= 0 || *usersFor > time.Hour:
		return fmt.Errorf("--users-for %v: want more than 0, at most 1h", *usersFor)
	case !(*flaky >= 0 && *flaky <= 1):
		return fmt.Errorf("--flaky %v: want a probability in [0, 1]", *flaky)
	case *maxRecovery <= 0 || *maxRecovery > time.Hour:
		return fmt.Errorf("--max-recovery %v: want more than 0, at most 1h", *maxRecovery)
	}
	if *chart != "" {
		if _, err := chartFormat(*chart); err != nil {
			return err
		}
		// Fail now, not after the run, when the chart cannot be written.
		if err := checkWritableDir(*chart); err != nil {
			return fmt.Errorf("--chart %s: %w", *chart, err)
		}
	}
	cfg := simConfig{
		rate:        rate,
		duration:    *duration,
		users:       *users,
		usersFor:    *usersFor,
		flaky:       *flaky,
		seed:        *seed,
		maxRecovery: *maxRecovery,
		tail:        300 * time.Millisecond,
	}

	var p progress = noProgress{}
	var b *bar
	if isTerminal(stdout) && isTerminal(stderr) {
		b = newBar(stderr, len(ms))
		p = b
	}
	rs, err := simulate(ctx, cfg, ms, p)
	if b != nil {
		b.finish()
	}
	if err := printFinished(ctx, err, len(rs), func() error {
		if *asJSON {
			return writeJSON(stdout, rs)
		}
		return writeTable(stdout, cfg, ms[:len(rs)], rs)
	}); err != nil {
		return err // an interrupted run draws no chart
	}
	if *chart != "" {
		title, broke, back := "payment killed: calls per second at payment", "payment killed", "payment restarted"
		if cfg.flaky > 0 {
			title = fmt.Sprintf("payment failing %.0f %% at random: calls per second at payment", cfg.flaky*100)
			broke, back = "payment failing", "payment healthy again"
		}
		openKey := fmt.Sprintf("then %d req/s, open loop", cfg.rate)
		usersKey := fmt.Sprintf("%d users start, closed loop", cfg.users)
		if err := writeChart(*chart, title, broke, back, openKey, usersKey, rs); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
		where := *chart
		if abs, err := filepath.Abs(where); err == nil {
			where = abs
		}
		if *asJSON { // stdout is the JSON alone
			fmt.Fprintf(stderr, "stormsim: chart written to %s\n", where)
		} else {
			fmt.Fprintf(stdout, "\nchart written to %s\n", where)
		}
	}
	return nil
}
