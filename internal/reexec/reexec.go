// Package reexec runs a test binary again as a worker process: a separate
// OS process, with Redis clients of its own, that a test starts, stops or
// kills like another server of a deployment would be.
//
// The test side builds the command with Command; the package's TestMain
// calls Main first, which in a worker process runs the package's worker
// function on the spec the test gave it and exits. What a worker does, and
// the spec it takes, are each package's own (worker_test.go).
package reexec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// Command returns the command of one worker process: this test binary,
// running no test, with env set to "1" and spec, JSON-encoded, on its
// standard input (a spec can be too long for the environment). The caller
// sets its output and starts it.
func Command(tb testing.TB, env string, spec any) *exec.Cmd {
	tb.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"=1")
	cmd.Stdin = bytes.NewReader(b)
	return cmd
}

// Main returns at once unless this process is a worker that Command started
// with env. A worker decodes its spec from standard input, runs worker on
// it and exits with the code worker returns (2 if the spec does not
// decode). TestMain calls it first.
func Main[S any](env string, worker func(spec S) int) {
	if os.Getenv(env) == "" {
		return
	}
	var spec S
	if err := json.NewDecoder(os.Stdin).Decode(&spec); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	os.Exit(worker(spec))
}
