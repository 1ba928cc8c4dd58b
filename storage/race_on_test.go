//go:build race

package storage

// raceOn: the race detector's instrumentation allocates on its own, so
// allocation counts are checked only without it.
const raceOn = true
