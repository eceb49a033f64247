package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestFlagErrors: bad flags are clear errors, never a panic or a run.
func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-runs", "0"}, "-runs 0"},
		{[]string{"-connections", "0"}, "-connections 0"},
		{[]string{"-cpu", "0s"}, "-cpu 0s"},
		{[]string{"-scenarios", "("}, "-scenarios"},
		{[]string{"-stacks", "["}, "-stacks"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"-bogus"}, "not defined"},
	} {
		if _, err := parseFlags(tc.args, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	for _, tc := range []struct {
		o    options
		want string
	}{
		{options{load: "wrk"}, "want ghz or go"},
		{options{load: "ghz", ghz: "/nonexistent/ghz", proto: "x"}, "make bench-busy installs ghz"},
	} {
		if _, err := fixedLoad(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error containing %q", tc.o, err, tc.want)
		}
	}
	if l, err := fixedLoad(options{load: "go"}); err != nil || l.Name() != "go" {
		t.Errorf("-load go: got %v, %v", l, err)
	}
}
