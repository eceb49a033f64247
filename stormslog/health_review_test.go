package stormslog_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/stormslog"
)

// (From the review of the session's range, 2026-12-05.) The server ends NOT_SERVING (N, S, N, S, N): the last health line the
// log holds must say so.
func TestHealthLastLineIsCurrentState(t *testing.T) {
	buf := &buffer{}
	clk := clock.NewFake(frozen)
	o := stormslog.New(newLogger(buf, slog.LevelInfo), stormslog.WithClock(clk))
	ctx := context.Background()
	for i := range 5 {
		k := interceptor.EventNotServing
		if i%2 == 1 {
			k = interceptor.EventServing
		}
		o.Observe(ctx, interceptor.Event{Kind: k})
	}
	clk.Advance(2 * time.Second)
	o.Flush()
	lines := buf.lines()
	last := lines[len(lines)-1]
	t.Logf("log:\n%s", strings.Join(lines, "\n"))
	if !strings.Contains(last, "NOT_SERVING") && !strings.Contains(last, "not serving") {
		t.Fatalf("server ended NOT_SERVING, last health line: %s", last)
	}
}
