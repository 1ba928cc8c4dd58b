// Package readme_test compiles every Go block of the repository's
// README.md, so that what a new user copies builds.
//
// Conventions for a ```go block in README.md:
//
//   - A block that starts with "package main" is a complete program and is
//     compiled as it is.
//   - Any other block is a fragment, compiled the way the README says it
//     is used: pasted at the end of the quick start's main (the first
//     "package main" block), so in the same scope as its ctx, rdb, sw, err
//     and c, with s (*storage.Storage) a package-level variable, in a file
//     that imports the packages of fragmentImports. A fragment has no
//     import block, must not declare the quick start's names again with :=
//     (no new variables on the left side), and must use every variable it
//     declares. Each fragment is pasted alone: fragments are not compiled
//     after one another.
//   - A block whose first line is a comment starting with "// not compiled:"
//     (followed by the reason) is skipped.
package readme_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fragmentImports are the imports a fragment may use: path and a
// package-level reference that keeps an unused import legal.
var fragmentImports = [][2]string{
	{"context", "context.Background"},
	{"log", "log.Println"},
	{"net/http", "http.NewRequest"},
	{"net/url", "url.Parse"},
	{"os", "os.Getenv"},
	{"time", "time.Second"},
	{"github.com/gocolly/colly/v2", "colly.NewCollector"},
	{"github.com/gocolly/colly/v2/queue", "queue.New"},
	{"github.com/prometheus/client_golang/prometheus", "prometheus.MustRegister"},
	{"github.com/proxyswitch/proxyswitch", "proxyswitch.New"},
	{"github.com/proxyswitch/proxyswitch/metrics", "metrics.New"},
	{"github.com/proxyswitch/proxyswitch/probe", "probe.DefaultEvery"},
	{"github.com/proxyswitch/proxyswitch/shard", "shard.Modulo{}"},
	{"github.com/proxyswitch/proxyswitch/source", "source.DefaultEvery"},
	{"github.com/proxyswitch/proxyswitch/storage", "storage.New"},
	{"github.com/redis/go-redis/v9", "redis.NewClient"},
}

// goBlock is one ```go block of the README: its text and the line of the
// README it starts on.
type goBlock struct {
	line int
	text string
}

var fence = regexp.MustCompile("(?ms)^```go\n(.*?)^```")

func readmeBlocks(t *testing.T, readme string) []goBlock {
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []goBlock
	for _, m := range fence.FindAllSubmatchIndex(b, -1) {
		blocks = append(blocks, goBlock{
			line: bytes.Count(b[:m[2]], []byte("\n")) + 1,
			text: string(b[m[2]:m[3]]),
		})
	}
	return blocks
}

// quickStart returns the body of the quick start's main function (the
// first block that starts with "package main"), which fragments follow, and
// the README line it starts on.
func quickStart(t *testing.T, blocks []goBlock) goBlock {
	for _, b := range blocks {
		if !strings.HasPrefix(strings.TrimSpace(b.text), "package main") {
			continue
		}
		const open = "func main() {\n"
		i := strings.Index(b.text, open)
		j := strings.LastIndex(b.text, "}")
		if i < 0 || j < i {
			t.Fatalf("README.md:%d: the quick start has no func main() { ... }", b.line)
		}
		body := b.text[i+len(open) : j]
		return goBlock{line: b.line + strings.Count(b.text[:i+len(open)], "\n"), text: body}
	}
	t.Fatal("README.md has no \"package main\" block: no quick start for the fragments to follow")
	return goBlock{}
}

// program returns the source of b as a compilable main package, or "" for
// a block marked "// not compiled:". A fragment is pasted after qs, the
// quick start's main body. Line directives make the compiler's errors point
// at README.md's lines.
func program(b, qs goBlock) string {
	first, _, _ := strings.Cut(strings.TrimSpace(b.text), "\n")
	line := fmt.Sprintf("//line README.md:%d\n", b.line)
	switch {
	case strings.HasPrefix(first, "// not compiled:"):
		return ""
	case strings.HasPrefix(first, "package main"):
		return line + b.text
	}
	var src strings.Builder
	src.WriteString("package main\n\nimport (\n")
	for _, imp := range fragmentImports {
		fmt.Fprintf(&src, "\t%q\n", imp[0])
	}
	src.WriteString(")\n\nvar (\n")
	for _, imp := range fragmentImports {
		fmt.Fprintf(&src, "\t_ = %s\n", imp[1])
	}
	src.WriteString(")\n\n// s is the storage of the README's storage section.\nvar s *storage.Storage\n\n")
	src.WriteString("func main() {\n")
	fmt.Fprintf(&src, "//line README.md:%d\n", qs.line)
	src.WriteString(qs.text)
	src.WriteString("\n")
	src.WriteString(line)
	src.WriteString(b.text)
	src.WriteString("}\n")
	return src.String()
}

func TestReadmeGoBlocksCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every Go block of README.md in a module of its own: skipped with -short")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	blocks := readmeBlocks(t, filepath.Join(root, "README.md"))
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```go block: is the fence pattern wrong?")
	}
	goVersion, err := exec.Command("go", "list", "-m", "-f", "{{.GoVersion}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	dir := t.TempDir()
	gomod := fmt.Sprintf("module readmecheck\n\ngo %s\n\nrequire github.com/proxyswitch/proxyswitch v0.0.0\n\nreplace github.com/proxyswitch/proxyswitch => %s\n",
		strings.TrimSpace(string(goVersion)), root)
	write(t, filepath.Join(dir, "go.mod"), gomod)
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "go.sum"), string(sum))
	qs := quickStart(t, blocks)
	compiled := 0
	for _, b := range blocks {
		src := program(b, qs)
		if src == "" {
			t.Logf("README.md:%d: not compiled (marked so)", b.line)
			continue
		}
		write(t, filepath.Join(dir, fmt.Sprintf("block%d", b.line), "main.go"), src)
		compiled++
	}
	cmd := exec.Command("go", "vet", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("a Go block of README.md does not compile (go vet in a module that imports this one):\n%s", out)
	}
	t.Logf("compiled %d of %d Go blocks of README.md", compiled, len(blocks))
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
