//go:build !linux

package main

import "os/exec"

// setParentDeathSignal: only Linux has a parent-death signal; elsewhere the
// test's cleanups alone stop the processes it started.
func setParentDeathSignal(*exec.Cmd) {}
