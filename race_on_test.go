//go:build race

package proxyswitch

// raceOn: the race detector slows single-goroutine walks over a million
// entries four to five times without finding anything in them, so
// TestMillionProxies runs at a tenth of its size under -race (.ci/run runs
// it at full size without).
const raceOn = true
