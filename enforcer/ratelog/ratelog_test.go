package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSpace(b.b.String()), "\n")
}

// TestHoldsBackWithinTheInterval: the first line is written at once, the
// rest of a burst as one line with their count when the interval ends,
// and a line after a quiet interval at once again.
func TestHoldsBackWithinTheInterval(t *testing.T) {
	var out buffer
	const every = time.Second
	l := New(slog.New(slog.NewTextHandler(&out, nil)), slog.LevelWarn, "refused", every)
	for i := range 1000 {
		l.Log("n", i)
	}
	if got := out.lines(); len(got) != 1 || !strings.Contains(got[0], "n=0") {
		t.Fatalf("after a burst, before the interval ends: %q, want the first line only", got)
	}
	deadline := time.Now().Add(5 * every)
	for len(out.lines()) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := out.lines()
	if len(got) != 2 || !strings.Contains(got[1], "n=999 suppressed=998") {
		t.Fatalf("after the interval: %q, want one line for the 999 held, the latest's attributes", got)
	}
	time.Sleep(every + every/2)
	l.Log("n", 1000)
	if got := out.lines(); len(got) != 3 || !strings.Contains(got[2], "n=1000") || strings.Contains(got[2], "suppressed") {
		t.Fatalf("after a quiet interval: %q, want the line at once", got)
	}
}
