//go:build !unix

package proxyswitch

import "time"

// processCPU is not measured here: BenchmarkCrawl reports a cpu-µs/page of 0.
func processCPU() time.Duration { return 0 }
