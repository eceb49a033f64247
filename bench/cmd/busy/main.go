// Command busy runs the load-test scenarios of issue 19 ("busy is not
// broken") as users measure: every tier of the gateway -> order ->
// payment chain its own process (cmd/tier) over loopback TCP, driven by
// ghz at a fixed concurrency and by the project's own open-loop
// generator, with retries off (none) and the peer stacks in the same
// run, each figure the median of interleaved runs; it prints markdown
// tables. See bench/BUSY.md.
//
//	make bench-busy                                  # from the root: installs ghz, runs everything
//	go run ./cmd/busy -quick                         # from bench/: a look in a few minutes
//	go run ./cmd/busy -scenarios replicas -stacks 'recommended'
//	go run ./cmd/busy -scenarios outage              # payment out for 2 s after healthy traffic, then back
//	go run ./cmd/busy -load go                       # without ghz: the project's fixed-concurrency load
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/stormguard/stormguard/bench"
	"github.com/stormguard/stormguard/bench/busy"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "busy:", err)
		stop()
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	load, ghz, proto, importPath, tier   string
	conns, runs                          int
	quick, verbose, diagnose, tierCounts bool
	only, stacks                         *regexp.Regexp
	cpu                                  time.Duration
	seed                                 uint64
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("busy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.load, "load", "ghz", "fixed-concurrency load: ghz (the binary, as users measure) or go (the project's own, needs nothing but Go)")
	fs.StringVar(&o.ghz, "ghz", "../bin/ghz", "the ghz `binary` (make bin/ghz installs the pinned version)")
	fs.StringVar(&o.proto, "proto", "../proto/stormguard/testsvc/v1/testsvc.proto", "the test service's .proto `file`, for ghz")
	fs.StringVar(&o.importPath, "import-paths", "../proto", "the .proto file's import `root`, for ghz")
	fs.IntVar(&o.conns, "connections", 1, "connections of the load to the gateway (ghz --connections; 1 is ghz's default)")
	fs.StringVar(&o.tier, "tier", "", "the tier `binary` (cmd/tier); empty: go build it from ./cmd/tier")
	fs.IntVar(&o.runs, "runs", 3, "interleaved runs per stack and case; each figure is their median")
	fs.BoolVar(&o.quick, "quick", false, "smaller and shorter scenarios, for a look in a few minutes")
	scen := fs.String("scenarios", "", "run only the scenarios whose name matches this `regexp`: "+strings.Join(busy.Scenarios, ", "))
	stacks := fs.String("stacks", "", "run only the stacks whose name matches this `regexp` (none, retries off, always runs)")
	fs.DurationVar(&o.cpu, "cpu", busy.DefaultParams.CPU, "CPU per request of the CPU-bound payment (calibrated once, at start)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the random failures")
	fs.BoolVar(&o.verbose, "v", false, "pass every tier's log to stderr")
	fs.BoolVar(&o.tierCounts, "tier-counts", false, "after each run, print every tier's counts to stderr")
	fs.BoolVar(&o.diagnose, "diagnose", false, "add the diagnostic stacks (bench.DiagnosticStacks: what one part of stormguard costs) to the capacity and slow scenarios")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case o.runs < 1:
		return o, fmt.Errorf("-runs %d: want >= 1", o.runs)
	case o.conns < 1:
		return o, fmt.Errorf("-connections %d: want >= 1", o.conns)
	case o.cpu <= 0:
		return o, fmt.Errorf("-cpu %v: want > 0", o.cpu)
	}
	if o.only, err = regexp.Compile(*scen); err != nil {
		return o, fmt.Errorf("-scenarios: %w", err)
	}
	if o.stacks, err = regexp.Compile(*stacks); err != nil {
		return o, fmt.Errorf("-stacks: %w", err)
	}
	return o, nil
}

// fixedLoad returns the fixed-concurrency load the flags ask for.
func fixedLoad(o options) (busy.FixedLoad, error) {
	switch o.load {
	case "ghz":
		for _, f := range []string{o.ghz, o.proto} {
			if _, err := os.Stat(f); err != nil {
				return nil, fmt.Errorf("-load ghz: %w (from the root, make bench-busy installs ghz; or -load go)", err)
			}
		}
		return busy.Ghz{Path: o.ghz, Proto: o.proto, ImportPath: o.importPath, Connections: o.conns}, nil
	case "go":
		return busy.GoLoad{Connections: o.conns}, nil
	}
	return nil, fmt.Errorf("-load %q: want ghz or go", o.load)
}

// tierBinary returns the tier binary of the flags, or builds one into a
// temporary directory that cleanup removes.
func tierBinary(ctx context.Context, o options, stderr io.Writer) (path string, cleanup func(), err error) {
	if o.tier != "" {
		return o.tier, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "busy-tier-")
	if err != nil {
		return "", nil, err
	}
	path = filepath.Join(dir, "tier")
	b := exec.CommandContext(ctx, "go", "build", "-o", path, "./cmd/tier")
	b.Stdout, b.Stderr = stderr, stderr
	if err := b.Run(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("go build ./cmd/tier (run from bench/, or pass -tier): %w", err)
	}
	return path, func() { os.RemoveAll(dir) }, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	fixed, err := fixedLoad(o)
	if err != nil {
		return err
	}
	tier, cleanup, err := tierBinary(ctx, o, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	p := busy.DefaultParams
	if o.quick {
		p = busy.Quick(p)
	}
	p.CPU = o.cpu
	if o.diagnose {
		for _, s := range bench.DiagnosticStacks() {
			p.CapStacks = append(p.CapStacks, s.Name)
			p.SlowStacks = append(p.SlowStacks, s.Name)
		}
	}
	if p.CPUUnits, err = busy.Calibrate(p.CPU); err != nil {
		return fmt.Errorf("-cpu: %w", err)
	}
	h := &busy.Harness{
		Launcher:   busy.Launcher{Path: tier},
		Load:       fixed,
		OpenConns:  o.conns,
		Runs:       o.runs,
		Stacks:     o.stacks,
		Params:     p,
		Seed:       o.seed,
		Out:        stdout,
		Progress:   stderr,
		TierCounts: o.tierCounts,
	}
	if o.verbose {
		h.Launcher.Log = stderr
	}
	began := time.Now()
	fmt.Fprintf(stdout, "# Busy is not broken: the chain as processes over loopback TCP\n\n")
	fmt.Fprintf(stdout, "%s/%s, %d CPUs, %s, load %s, %d runs per figure, seed %d, %s\n\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), fixed.Name(), o.runs, o.seed, began.UTC().Format(time.RFC3339))
	fmt.Fprintf(stdout, "Command: `busy %s`\n\n", strings.Join(args, " "))
	h.Describe()
	if err := h.Run(ctx, o.only); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Busy run took %v.\n", time.Since(began).Round(time.Second))
	return nil
}
