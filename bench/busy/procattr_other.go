//go:build !linux

package busy

import "os/exec"

// setParentDeathSignal: only Linux has a parent-death signal; elsewhere
// the harness's own Stop ends the processes it started.
func setParentDeathSignal(*exec.Cmd) {}
