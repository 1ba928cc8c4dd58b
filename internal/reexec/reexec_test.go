package reexec

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

const testEnv = "REEXEC_TEST_WORKER"

type spec struct {
	Say  string `json:"say"`
	Code int    `json:"code"`
}

func TestMain(m *testing.M) {
	Main(testEnv, func(s spec) int {
		fmt.Println(s.Say)
		return s.Code
	})
	os.Exit(m.Run())
}

func TestWorkerGetsSpecAndExitsWithItsCode(t *testing.T) {
	long := strings.Repeat("x", 1<<20) // more than the environment takes
	out, err := Command(t, testEnv, spec{Say: long}).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != long {
		t.Fatalf("worker said %d bytes, want %d", len(got), len(long))
	}

	out, err = Command(t, testEnv, spec{Say: "bye", Code: 3}).Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("exit: %v, want code 3", err)
	}
	if got := strings.TrimSpace(string(out)); got != "bye" {
		t.Fatalf("worker said %q, want bye", got)
	}
}

func TestWorkerRefusesABadSpec(t *testing.T) {
	cmd := Command(t, testEnv, spec{})
	cmd.Stdin = strings.NewReader("not json")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("exit: %v, want code 2", err)
	}
	if !strings.HasPrefix(string(out), "worker: ") {
		t.Fatalf("output %q, want the decoding error", out)
	}
}
