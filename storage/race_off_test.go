//go:build !race

package storage

// raceOn: see race_on_test.go.
const raceOn = false
