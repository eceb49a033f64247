// Command incidents prints the incident simulation's tables (see package
// incidentsim) as Markdown.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/stormguard/stormguard/internal/incidentsim"
)

func main() {
	seed := flag.Uint64("seed", 1, "random seed")
	flag.Parse()
	if err := incidentsim.Report(os.Stdout, *seed); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
