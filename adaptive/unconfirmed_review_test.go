package adaptive

import (
	"slices"
	"testing"
	"time"
)

// (From the review of the session's range, 2026-12-05.) A probe went out while the target was down; the channel came back
// (unconfirmed revival, not reported); then the probe's answer is a
// "do not retry", which the interceptor turns into Revive() (a signal
// from the target itself). The target is up and has answered, yet the
// listeners still hold it down.
func TestConfirmedReviveAfterUnconfirmed(t *testing.T) {
	var reports []bool
	th, clk := newTest(t, Config{OnDown: func(_ string, down bool) { reports = append(reports, down) }})
	attempt(th, false, Accept)
	clk.Advance(time.Second)
	th.Connectivity(false)
	attempt(th, false, Overload)
	if !th.Down() {
		t.Fatal("not down")
	}
	th.Connectivity(true) // revival by the connection alone
	th.Revive()           // an answer from the target: confirmed
	if th.Down() {
		t.Fatal("down")
	}
	if want := []bool{true, false}; !slices.Equal(reports, want) {
		t.Fatalf("reports %v after a confirmed revival; want %v (target up and answering, listeners say down)", reports, want)
	}
}
