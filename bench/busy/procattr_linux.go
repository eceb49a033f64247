package busy

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes the kernel kill cmd when the thread that
// started it exits, so that no tier outlives a harness that died.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
