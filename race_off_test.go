//go:build !race

package proxyswitch

// raceOn: see race_on_test.go.
const raceOn = false
