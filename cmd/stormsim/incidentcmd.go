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
	replicas                      *string
}

func incidentFlags(fs *flag.FlagSet) incidentFlagValues {
	return incidentFlagValues{
		rate:     fs.Int("rate", 0, "open-loop user requests per second, 1 to 10000: kill's sustained phase (default 200); outage, partial, hang (default 300); slow (default 240)"),
		healthy:  fs.Duration("healthy", 0, "outage, partial, hang, slow: healthy traffic before the incident (default 1.5s; slow 1s)"),
		during:   fs.Duration("for", 0, "outage, partial, hang, slow, long: length of the incident (default 3s; slow 1s; long 30s)"),
		after:    fs.Duration("after", 0, "outage, partial, hang, slow: traffic after the incident (default 1.5s; slow 2.5s)"),
		slice:    fs.Duration("slice", 0, "outage, partial, hang, slow: width of a time slice of the table (default 250ms)"),
		replicas: fs.String("replicas", "", "fleet: comma-separated fleet sizes, each 1 to 1000 (default 1,10,100,1000)"),
	}
}

// scenarioFlags are the flags that each scenario reads; json and seed go
// with every one.
var scenarioFlags = map[string][]string{
	scenarioKill:    {"modes", "rate", "duration", "users", "users-for", "flaky", "chart", "max-recovery"},
	scenarioOutage:  {"modes", "rate", "healthy", "for", "after", "slice"},
	scenarioPartial: {"modes", "rate", "healthy", "for", "after", "slice"},
	scenarioHang:    {"modes", "rate", "healthy", "for", "after", "slice"},
	scenarioSlow:    {"modes", "rate", "healthy", "for", "after", "slice"},
	scenarioLong:    {"for"},
	scenarioFleet:   {"replicas"},
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
	set := func(dst *time.Duration, d time.Duration, name string) error {
		if d == 0 {
			return nil
		}
		if d < 0 || d > time.Hour {
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

// incidentDemo runs a sliced scenario and prints its table (or JSON).
func incidentDemo(ctx context.Context, scenario, modesFlag string, seed uint64, asJSON bool, v incidentFlagValues, stdout, stderr io.Writer) error {
	ic, err := incidentConfigOf(scenario, seed, v)
	if err != nil {
		return err
	}
	var ms []chainMode
	switch scenario {
	case scenarioSlow:
		if modesFlag == strings.Join(modeNames(), ",") { // the default
			modesFlag = ""
		}
		if ms, err = parseSlowModes(modesFlag); err != nil {
			return err
		}
	case scenarioOutage, scenarioPartial, scenarioHang:
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
	if err != nil {
		return err
	}
	if asJSON {
		return writeSlicedJSON(stdout, r)
	}
	return writeSliced(stdout, r)
}
