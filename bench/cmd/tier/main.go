// Command tier serves one tier of the gateway -> order -> payment test
// chain as its own process, over TCP on 127.0.0.1, with one of the bench
// stacks and the work per request of a load test (CPU, waiting, a worker
// pool, failures). The harness (cmd/busy) starts three or more of them;
// to try one by hand:
//
//	go run ./cmd/tier --tier payment --stack recommended --cpu 200us
//	go run ./cmd/tier --tier order --stack recommended --next 127.0.0.1:PORT
//
// It prints the URL of its counters and its address on stdout, and stops
// on SIGTERM or SIGINT. Its stats port also serves its arrivals per
// millisecond (GET /arrivals) and switches it to failing everything and
// back (POST /fail-all?on=1, on=0).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/stormguard/stormguard/bench/busy"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := busy.ServeTier(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "tier:", err)
		stop()
		os.Exit(2)
	}
}
