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

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("busy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	load := fs.String("load", "ghz", "fixed-concurrency load: ghz (the binary, as users measure) or go (the project's own, needs nothing but Go)")
	ghzPath := fs.String("ghz", "../bin/ghz", "the ghz `binary` (make bin/ghz installs the pinned version)")
	proto := fs.String("proto", "../proto/stormguard/testsvc/v1/testsvc.proto", "the test service's .proto `file`, for ghz")
	importPath := fs.String("import-paths", "../proto", "the .proto file's import `root`, for ghz")
	conns := fs.Int("connections", 1, "connections of the load to the gateway (ghz --connections; 1 is ghz's default)")
	tierPath := fs.String("tier", "", "the tier `binary` (cmd/tier); empty: go build it from ./cmd/tier")
	runs := fs.Int("runs", 3, "interleaved runs per stack and case; each figure is their median")
	quick := fs.Bool("quick", false, "smaller and shorter scenarios, for a look in a few minutes")
	scen := fs.String("scenarios", "", "run only the scenarios whose name matches this `regexp`: "+strings.Join(busy.Scenarios, ", "))
	stacks := fs.String("stacks", "", "run only the stacks whose name matches this `regexp` (none, retries off, always runs)")
	cpu := fs.Duration("cpu", busy.DefaultParams.CPU, "CPU per request of the CPU-bound payment (calibrated once, at start)")
	seed := fs.Uint64("seed", 1, "seed of the random failures")
	verbose := fs.Bool("v", false, "pass every tier's log to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *runs < 1 {
		return fmt.Errorf("-runs %d: want >= 1", *runs)
	}
	if *conns < 1 {
		return fmt.Errorf("-connections %d: want >= 1", *conns)
	}
	only, err := regexp.Compile(*scen)
	if err != nil {
		return fmt.Errorf("-scenarios: %w", err)
	}
	sre, err := regexp.Compile(*stacks)
	if err != nil {
		return fmt.Errorf("-stacks: %w", err)
	}

	var fixed busy.FixedLoad
	switch *load {
	case "ghz":
		for _, f := range []string{*ghzPath, *proto} {
			if _, err := os.Stat(f); err != nil {
				return fmt.Errorf("-load ghz: %w (from the root, make bench-busy installs ghz; or -load go)", err)
			}
		}
		fixed = busy.Ghz{Path: *ghzPath, Proto: *proto, ImportPath: *importPath, Connections: *conns}
	case "go":
		fixed = busy.GoLoad{Connections: *conns}
	default:
		return fmt.Errorf("-load %q: want ghz or go", *load)
	}

	if *tierPath == "" {
		dir, err := os.MkdirTemp("", "busy-tier-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		*tierPath = filepath.Join(dir, "tier")
		b := exec.CommandContext(ctx, "go", "build", "-o", *tierPath, "./cmd/tier")
		b.Stdout, b.Stderr = stderr, stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("go build ./cmd/tier (run from bench/, or pass -tier): %w", err)
		}
	}

	p := busy.DefaultParams
	if *quick {
		p = busy.Quick(p)
	}
	p.CPU = *cpu
	if p.CPUUnits, err = busy.Calibrate(p.CPU); err != nil {
		return fmt.Errorf("-cpu: %w", err)
	}
	h := &busy.Harness{
		Launcher:  busy.Launcher{Path: *tierPath},
		Load:      fixed,
		OpenConns: *conns,
		Runs:      *runs,
		Stacks:    sre,
		Params:    p,
		Seed:      *seed,
		Out:       stdout,
		Progress:  stderr,
	}
	if *verbose {
		h.Launcher.Log = stderr
	}
	began := time.Now()
	fmt.Fprintf(stdout, "# Busy is not broken: the chain as processes over loopback TCP\n\n")
	fmt.Fprintf(stdout, "%s/%s, %d CPUs, %s, load %s, %d runs per figure, seed %d, %s\n\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), fixed.Name(), *runs, *seed, began.UTC().Format(time.RFC3339))
	fmt.Fprintf(stdout, "Command: `busy %s`\n\n", strings.Join(args, " "))
	h.Describe()
	if err := h.Run(ctx, only); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Busy run took %v.\n", time.Since(began).Round(time.Second))
	return nil
}
