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
	if q1, med, q3 := quartiles([]float64{4, 1, 3, 2}); q1 != 1.75 || med != 2.5 || q3 != 3.25 {
		t.Errorf("quartiles of 1..4: %v %v %v, want 1.75 2.5 3.25", q1, med, q3)
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
