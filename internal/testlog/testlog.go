// Package testlog captures what the code under test writes, its log lines
// or a command's output, for a test to read while that code may still be
// writing.
package testlog

import (
	"bytes"
	"log/slog"
	"sync"
)

// Buffer is a bytes.Buffer that is safe for concurrent use. The zero value
// is an empty buffer ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Logger returns a text logger (log/slog) writing to b at every level,
// debug included.
func (b *Buffer) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
