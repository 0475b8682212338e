// Package testlog collects log output in tests, from any goroutine, so tests can assert on it
// (for example that no secret was ever logged).
package testlog

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer safe for concurrent writes.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
