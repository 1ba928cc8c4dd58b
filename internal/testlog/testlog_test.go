package testlog

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestBufferConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				fmt.Fprintf(&b, "w%d\n", i)
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if n := strings.Count(b.String(), "\n"); n != 800 {
		t.Fatalf("%d lines, want 800", n)
	}
}

func TestLoggerWritesDebug(t *testing.T) {
	var b Buffer
	b.Logger().Debug("detail", "k", "v")
	if got := b.String(); !strings.Contains(got, "level=DEBUG") || !strings.Contains(got, "msg=detail k=v") {
		t.Fatalf("log %q", got)
	}
}
