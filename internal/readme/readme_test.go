// Package readme_test compiles every Go block of the repository's
// README.md, so that what a new user copies builds.
//
// Conventions for a ```go block in README.md:
//
//   - A block that starts with "package main" is a complete program and is
//     compiled as it is.
//   - Any other block is a fragment: the body of a function in which ctx
//     (context.Context), rdb (*redis.Client), sw (*proxyswitch.Switch),
//     c (*colly.Collector) and s (*storage.Storage) are in scope, in a file
//     that imports the packages of fragmentImports. A fragment has no
//     import block, may declare those names again, and must use every
//     variable it declares.
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

// program returns the source of b as a compilable main package, or "" for
// a block marked "// not compiled:". A line directive makes the compiler's
// errors point at README.md's lines.
func program(b goBlock) string {
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
	src.WriteString(")\n\nfunc main() {}\n\n")
	src.WriteString("func fragment(ctx context.Context, rdb *redis.Client, sw *proxyswitch.Switch, c *colly.Collector, s *storage.Storage) {\n\t{\n")
	src.WriteString(line)
	src.WriteString(b.text)
	src.WriteString("\t}\n}\n")
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
	compiled := 0
	for _, b := range blocks {
		src := program(b)
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
