package ratelog

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// lines is what was logged so far, a line each.
func lines(b *simtest.LockedBuffer) []string {
	return strings.Split(strings.TrimSpace(b.String()), "\n")
}

// TestHoldsBackWithinTheInterval: the first line is written at once, the
// rest of a burst as one line with their count when the interval ends,
// and a line after a quiet interval at once again.
func TestHoldsBackWithinTheInterval(t *testing.T) {
	var out simtest.LockedBuffer
	const every = time.Second
	l := New(slog.New(slog.NewTextHandler(&out, nil)), slog.LevelWarn, "refused", every)
	for i := range 1000 {
		l.Log("n", i)
	}
	if got := lines(&out); len(got) != 1 || !strings.Contains(got[0], "n=0") {
		t.Fatalf("after a burst, before the interval ends: %q, want the first line only", got)
	}
	deadline := time.Now().Add(5 * every)
	for len(lines(&out)) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := lines(&out)
	if len(got) != 2 || !strings.Contains(got[1], "n=999 suppressed=998") {
		t.Fatalf("after the interval: %q, want one line for the 999 held, the latest's attributes", got)
	}
	time.Sleep(every + every/2)
	l.Log("n", 1000)
	if got := lines(&out); len(got) != 3 || !strings.Contains(got[2], "n=1000") || strings.Contains(got[2], "suppressed") {
		t.Fatalf("after a quiet interval: %q, want the line at once", got)
	}
}
