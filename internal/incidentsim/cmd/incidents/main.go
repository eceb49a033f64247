// Command incidents prints the incident simulation's tables (see package
// incidentsim) as Markdown; with -tradeoffs, the tables of the targets
// that pull against each other instead.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/stormguard/stormguard/internal/incidentsim"
)

func main() {
	seed := flag.Uint64("seed", 1, "random seed")
	tradeoffs := flag.Bool("tradeoffs", false, "print the K and probe-ratio trade-off tables (seeds 1 to 8)")
	flag.Parse()
	var err error
	if *tradeoffs {
		err = incidentsim.Tradeoffs(os.Stdout, 8)
	} else {
		err = incidentsim.Report(os.Stdout, *seed)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
