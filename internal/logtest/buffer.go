package logtest

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent writers: the sink of a
// text logger or of a process's output that a test reads. The zero
// value is ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Lines returns what was written so far, a line at a time.
func (l *Buffer) Lines() []string { return strings.Split(strings.TrimSpace(l.String()), "\n") }
