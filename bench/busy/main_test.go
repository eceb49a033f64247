package busy

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

// tierEnv makes the test binary a tier process (ServeTier with its
// arguments) instead of running the tests: the tests start their tiers
// as processes of their own, with nothing to build.
const tierEnv = "BUSY_TEST_TIER"

func TestMain(m *testing.M) {
	if os.Getenv(tierEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		err := ServeTier(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "tier:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// testLauncher starts tiers as this test binary.
func testLauncher(t *testing.T) Launcher {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A race-enabled binary sleeps a second at exit (GORACE
	// atexit_sleep_ms, default 1000) for late reports: not for tiers that
	// are stopped on purpose.
	return Launcher{Path: exe, Env: []string{tierEnv + "=1", "GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")}}
}
