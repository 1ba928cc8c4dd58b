//go:build unix

package proxyswitch

import (
	"syscall"
	"time"
)

// processCPU is this process's CPU time so far, user + system: the
// crawler's, and the site's and proxies' it runs in process
// (BenchmarkCrawl's cpu-µs/page, which holds up under a load that makes
// pages/s noisy).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
