//go:build linux

package redistest

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// sysProcAttr makes the child die with SIGKILL when its parent goes away.
// Setpgid stays false so the child shares the test's process group.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: false}
}

// Pdeathsig fires when the *thread* that forked the child exits, not only
// when the whole process exits. The Go runtime may retire OS threads (for
// example when a goroutine exits while locked to its thread), which would
// kill redis-server at a random moment. So every child is started from a
// single goroutine that locks its OS thread and never returns.
var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

type spawnReq struct {
	cmd *exec.Cmd
	res chan<- error
}

func startCmd(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go spawner(spawnReqs)
	})
	res := make(chan error, 1)
	spawnReqs <- spawnReq{cmd: cmd, res: res}
	return <-res
}

func spawner(reqs <-chan spawnReq) {
	runtime.LockOSThread() // never unlocked: this thread lives as long as the process
	for r := range reqs {
		r.res <- r.cmd.Start()
	}
}
