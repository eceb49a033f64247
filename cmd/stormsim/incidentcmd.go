package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// incidentFlagValues are the flags of the sliced scenarios; zero values
// mean the scenario's default (incidentDefaults).
type incidentFlagValues struct {
	rate                          *int
	healthy, during, after, slice *time.Duration
	replicas, factors             *string
	// The demo's own flags that the busy scenarios read too, and
	// whether they were given.
	users              *int
	flaky              *float64
	usersSet, flakySet bool
	// given reports whether a flag was given on the command line (nil:
	// none was), so that a duration given as 0 is refused, not read as
	// "the default".
	given func(name string) bool
}

func incidentFlags(fs *flag.FlagSet) incidentFlagValues {
	return incidentFlagValues{
		rate:     fs.Int("rate", 0, "open-loop user requests per second, 1 to 10000: kill's sustained phase (default 200); outage, partial, hang (default 300); slow (default 240); tail (default 400)"),
		healthy:  fs.Duration("healthy", 0, "outage, partial, hang, slow: healthy traffic before the incident (default 1.5s; slow 1s); capacity: the healthy part (1s); replicas: before one fails (500ms); overload: arrivals at 0.5x before it (1s)"),
		during:   fs.Duration("for", 0, "outage, partial, hang, slow, long: length of the incident (default 3s; slow 1s; long 30s); capacity: the part with random failures (1s); replicas: one replica failing (2s); overload: the overload (2s); tail: the whole run (5s)"),
		after:    fs.Duration("after", 0, "outage, partial, hang, slow: traffic after the incident (default 1.5s; slow 2.5s); replicas: all healthy again (500ms); overload: arrivals at 0.5x after it (1s)"),
		slice:    fs.Duration("slice", 0, "outage, partial, hang, slow, capacity, replicas, overload: width of a time slice of the table (default 250ms); tail (default 1s)"),
		replicas: fs.String("replicas", "", "fleet: comma-separated fleet sizes, each 1 to 1000 (default 1,10,100,1000)"),
		factors: fs.String("factors", "", fmt.Sprintf("overload: comma-separated arrival rates during the overload, as factors of payment's capacity (%d calls/s), each above 0 and at most %d, one run each (default 2,8)",
			overloadCapacity, maxRate/overloadCapacity)),
	}
}

// scenarioFlags are the flags that each scenario reads; json and seed go
// with every one.
var scenarioFlags = map[string][]string{
	scenarioKill:     {"modes", "rate", "duration", "users", "users-for", "flaky", "chart", "max-recovery"},
	scenarioOutage:   {"modes", "rate", "healthy", "for", "after", "slice"},
	scenarioPartial:  {"modes", "rate", "healthy", "for", "after", "slice"},
	scenarioHang:     {"modes", "rate", "healthy", "for", "after", "slice"},
	scenarioSlow:     {"modes", "rate", "healthy", "for", "after", "slice"},
	scenarioLong:     {"for"},
	scenarioFleet:    {"replicas"},
	scenarioCapacity: {"modes", "users", "healthy", "for", "slice", "flaky"},
	scenarioReplicas: {"modes", "users", "healthy", "for", "after", "slice"},
	scenarioOverload: {"modes", "healthy", "for", "after", "slice", "factors"},
	scenarioTail:     {"modes", "rate", "for", "slice"},
}

// checkScenarioFlags fails for an unknown scenario, or a flag set on the
// command line that the scenario does not read.
func checkScenarioFlags(fs *flag.FlagSet, scenario string) error {
	allowed, ok := scenarioFlags[scenario]
	if !ok {
		return fmt.Errorf("--scenario %q: want one of %s", scenario, strings.Join(scenarioNames(), ", "))
	}
	var err error
	fs.Visit(func(f *flag.Flag) {
		if err == nil && f.Name != "scenario" && f.Name != "json" && f.Name != "seed" && !slices.Contains(allowed, f.Name) {
			err = fmt.Errorf("--%s does not apply to --scenario %s (it reads %s)", f.Name, scenario, strings.Join(append(allowed, "json", "seed"), ", "))
		}
	})
	return err
}

// incidentConfigOf returns the scenario's config with the flags applied,
// or an error for a bad value.
func incidentConfigOf(scenario string, seed uint64, v incidentFlagValues) (incidentConfig, error) {
	ic := incidentDefaults(scenario)
	ic.seed = seed
	given := func(name string) bool { return v.given != nil && v.given(name) }
	set := func(dst *time.Duration, d time.Duration, name string) error {
		if d == 0 && !given(name) {
			return nil
		}
		if d <= 0 || d > time.Hour {
			return fmt.Errorf("--%s %v: want more than 0, at most 1h", name, d)
		}
		*dst = d
		return nil
	}
	for _, x := range []struct {
		dst  *time.Duration
		d    time.Duration
		name string
	}{{&ic.healthy, *v.healthy, "healthy"}, {&ic.during, *v.during, "for"}, {&ic.after, *v.after, "after"}, {&ic.slice, *v.slice, "slice"}} {
		if err := set(x.dst, x.d, x.name); err != nil {
			return ic, err
		}
	}
	if *v.rate != 0 { // 0: not set (demo refuses a --rate 0 given)
		if *v.rate < 1 || *v.rate > maxRate {
			return ic, fmt.Errorf("--rate %d: want 1 to %d user requests per second", *v.rate, maxRate)
		}
		ic.rate = *v.rate
	}
	if ic.slice < 10*time.Millisecond {
		return ic, fmt.Errorf("--slice %v: want at least 10ms", ic.slice)
	}
	if isBusy(scenario) {
		if err := checkBusyConfig(&ic, v); err != nil {
			return ic, err
		}
	}
	switch scenario {
	case scenarioOutage, scenarioPartial, scenarioHang, scenarioSlow, scenarioCapacity, scenarioReplicas, scenarioOverload:
		// Each phase a whole number of slices, so that its summary is
		// the sum of its rows, from the phase's start.
		for _, x := range []struct {
			d    time.Duration
			name string
		}{{ic.healthy, "healthy"}, {ic.during, "for"}, {ic.after, "after"}} {
			if x.d%ic.slice != 0 {
				return ic, fmt.Errorf("--%s %v: want a multiple of the slice (%v) for --scenario %s", x.name, x.d, ic.slice, ic.scenario)
			}
		}
	case scenarioLong:
		// The table's rows run from 2.5 s to 4.5 s in the outage, then
		// to its end, and its first second is one of them.
		if ic.during < 2*time.Second {
			return ic, fmt.Errorf("--for %v: want at least 2s for --scenario long", ic.during)
		}
	}
	if *v.replicas != "" {
		ic.replicas = nil
		for f := range strings.SplitSeq(*v.replicas, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > 1000 {
				return ic, fmt.Errorf("--replicas %q: want fleet sizes of 1 to 1000, comma-separated", *v.replicas)
			}
			ic.replicas = append(ic.replicas, n)
		}
	}
	return ic, nil
}

// incidentDemo runs a sliced scenario and prints its table (or JSON);
// modesFlag is --modes, empty when not given (each scenario's default).
func incidentDemo(ctx context.Context, scenario, modesFlag string, seed uint64, asJSON bool, v incidentFlagValues, stdout, stderr io.Writer) error {
	ic, err := incidentConfigOf(scenario, seed, v)
	if err != nil {
		return err
	}
	if isBusy(scenario) {
		return busyDemo(ctx, ic, modesFlag, asJSON, stdout, stderr)
	}
	if scenario == scenarioTail {
		return tailDemo(ctx, ic, modesFlag, asJSON, stdout)
	}
	var ms []chainMode
	switch scenario {
	case scenarioSlow:
		if ms, err = parseSlowModes(modesFlag); err != nil {
			return err
		}
	case scenarioOutage, scenarioPartial, scenarioHang:
		if modesFlag == "" {
			modesFlag = strings.Join(modeNames(), ",")
		}
		m, err := parseModes(modesFlag)
		if err != nil {
			return err
		}
		ms = chainModes(m)
	}
	var p progress = noProgress{}
	var b *bar
	if isTerminal(stdout) && isTerminal(stderr) {
		n := len(ms)
		switch scenario {
		case scenarioLong:
			n = 5
		case scenarioFleet:
			n = len(ic.replicas)
		}
		b = newBarSteps(stderr, n)
		p = b
	}
	var r sliced
	switch scenario {
	case scenarioLong:
		r, err = runLong(ctx, ic, p)
	case scenarioFleet:
		r, err = runFleet(ctx, ic, p)
	default:
		r, err = runChainScenario(ctx, ic, ms, p)
	}
	if b != nil {
		b.finish()
	}
	return printFinished(ctx, err, len(r.Columns), func() error {
		if asJSON {
			return writeSlicedJSON(stdout, r)
		}
		return writeSliced(stdout, r)
	})
}

// checkBusyConfig applies the flags that only the busy scenarios read to
// ic, and fails for a bad value.
func checkBusyConfig(ic *incidentConfig, v incidentFlagValues) error {
	if v.usersSet {
		if *v.users < 1 || *v.users > 10000 {
			return fmt.Errorf("--users %d: want 1 to 10000 callers", *v.users)
		}
		ic.users = *v.users
	}
	if v.flakySet {
		if !(*v.flaky > 0 && *v.flaky <= 1) {
			return fmt.Errorf("--flaky %v: want a probability in (0, 1] for --scenario %s", *v.flaky, ic.scenario)
		}
		ic.flaky = *v.flaky
	}
	if *v.factors != "" {
		ic.factors = nil
		limit := float64(maxRate / overloadCapacity)
		for f := range strings.SplitSeq(*v.factors, ",") {
			x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || !(x > 0 && x <= limit) {
				return fmt.Errorf("--factors %q: want factors of payment's capacity above 0 and at most %g, comma-separated", *v.factors, limit)
			}
			ic.factors = append(ic.factors, x)
		}
	}
	return nil
}

// busyDemo runs a busy scenario and prints its table (or JSON).
func busyDemo(ctx context.Context, ic incidentConfig, modesFlag string, asJSON bool, stdout, stderr io.Writer) error {
	if modesFlag == "" {
		modesFlag = strings.Join(busyDefaultModes, ",")
	}
	ms, err := parseBusyModes(modesFlag)
	if err != nil {
		return err
	}
	var p progress = noProgress{}
	var b *bar
	if isTerminal(stdout) && isTerminal(stderr) {
		b = newBarSteps(stderr, len(ms)*max(len(ic.factors), 1))
		p = b
	}
	r, err := runBusy(ctx, ic, ms, p)
	if b != nil {
		b.finish()
	}
	return printFinished(ctx, err, len(r.Columns), func() error {
		if asJSON {
			return writeBusyJSON(stdout, r)
		}
		return writeBusy(stdout, r)
	})
}
