package probes

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// The committed object was generated from the C sources as they are: a C
// change without `make generate` fails here, no clang needed.
func TestGeneratedObjectIsCurrent(t *testing.T) {
	rec, err := os.ReadFile("gpuwarden_bpfel.sha256")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(rec)), "\n") {
		sum, file, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("bad line in gpuwarden_bpfel.sha256: %q", line)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s changed since the eBPF object was generated: run `make generate` (needs clang)", file)
		}
	}
}
