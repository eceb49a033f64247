package main

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes the kernel kill cmd when the thread that
// started it exits, so no tier outlives a test that died.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
