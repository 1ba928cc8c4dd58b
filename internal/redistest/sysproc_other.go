//go:build !linux

package redistest

import (
	"os/exec"
	"syscall"
)

// sysProcAttr returns the default attributes; Pdeathsig only exists on Linux,
// so elsewhere children are only killed by Close/cleanup.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}

func startCmd(cmd *exec.Cmd) error {
	return cmd.Start()
}
