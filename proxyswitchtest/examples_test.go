package proxyswitchtest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestExamplesBuildOutsideTheRepository copies each program under
// _examples, its .go files as they are, into a module of its own outside the
// repository ("module example", requiring this module, replaced by this
// checkout) and compiles and vets it there: an example that imports an
// internal package, or anything else only the repository can reach, fails.
// It compiles without linking (go list -export: go build would link five
// binaries, a minute on a small machine) and vets the test files too. It
// needs the go command and the module cache (or the module proxy) for the
// dependencies; -short skips it.
func TestExamplesBuildOutsideTheRepository(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds every example in a module of its own")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := filepath.Glob(filepath.Join(root, "_examples", "*"))
	if err != nil {
		t.Fatal(err)
	}
	mod := t.TempDir()
	var examples []string
	for _, dir := range dirs {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		if len(files) == 0 {
			continue
		}
		name := filepath.Base(dir)
		examples = append(examples, name)
		dst := filepath.Join(mod, name)
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			copyFile(t, f, filepath.Join(dst, filepath.Base(f)))
		}
	}
	if len(examples) == 0 {
		t.Fatal("no example found under _examples")
	}
	goMod := "module example\n\ngo 1.26\n\n" +
		"require github.com/proxyswitch/proxyswitch v0.0.0\n\n" +
		"replace github.com/proxyswitch/proxyswitch => " + root + "\n"
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte(goMod), 0o644); err != nil {
		t.Fatal(err)
	}
	// This module's sums cover every dependency the examples can reach.
	copyFile(t, filepath.Join(root, "go.sum"), filepath.Join(mod, "go.sum"))

	for _, args := range [][]string{{"list", "-export", "./..."}, {"vet", "./..."}} {
		cmd := exec.Command(goCmd, args...)
		cmd.Dir = mod
		cmd.Env = append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s, the examples (%s) copied out of the repository: %v\n%s",
				strings.Join(args, " "), strings.Join(examples, ", "), err, out)
		}
	}
	t.Logf("compiled and vetted outside the repository: %s", strings.Join(examples, ", "))
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
