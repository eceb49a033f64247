package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// One short round: every variant runs, answers, and has a row; the
// counts are of the chain's own requests.
func TestCallcostTable(t *testing.T) {
	var out bytes.Buffer
	if err := callcost([]string{"-callers", "4", "-rounds", "1", "-for", "50ms"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, v := range variants {
		row := "| " + v.name + " | "
		if !strings.Contains(out.String(), row) {
			t.Errorf("no row for %s in:\n%s", v.name, out.String())
		}
	}
	if !strings.Contains(out.String(), "| off | 1.000x") {
		t.Errorf("off is not its own unit:\n%s", out.String())
	}
}

func TestCallcostBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-rounds", "0"}, {"-callers", "0"}, {"-for", "0s"}, {"-nope"}} {
		if err := callcost(args, &bytes.Buffer{}); err == nil {
			t.Errorf("callcost %v: no error", args)
		}
	}
}
