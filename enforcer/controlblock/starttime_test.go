package controlblock

import (
	"os"
	"path/filepath"
	"testing"
)

func TestStartTime(t *testing.T) {
	proc := t.TempDir()
	stat := func(pid, text string) {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "stat"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A command with spaces and parentheses: fields count from the last ')'.
	stat("7", "7 (a) b (c)) S 1 7 7 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 987654 0 0\n")
	stat("5", "5 (short) S 1\n")
	if st, err := StartTime(proc, 7); err != nil || st != 987654 {
		t.Errorf("StartTime(7) = %d, %v; want 987654", st, err)
	}
	if _, err := StartTime(proc, 5); err == nil {
		t.Error("StartTime of a short stat gave no error")
	}
	if _, err := StartTime(proc, 9); err == nil {
		t.Error("StartTime of a missing process gave no error")
	}
	if st, err := StartTime("/proc", os.Getpid()); err != nil || st == 0 {
		t.Errorf("StartTime(self) = %d, %v", st, err)
	}
}
