package crio_test

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// testLog logs to the test, and counts messages containing a word.
type testLog struct {
	t  testing.TB
	mu sync.Mutex
	// lines holds every message.
	lines []string
}

func newTestLog(t testing.TB) (*slog.Logger, *testLog) {
	tl := &testLog{t: t}
	return slog.New(slog.NewTextHandler(tl, &slog.HandlerOptions{Level: slog.LevelInfo})), tl
}

func (l *testLog) Write(b []byte) (int, error) {
	s := strings.TrimSpace(string(b))
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
	l.t.Log(s)
	return len(b), nil
}

func (l *testLog) Contains(word string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.lines {
		if strings.Contains(s, word) {
			return true
		}
	}
	return false
}
