package vocab

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// The agent reads quantities without Kubernetes' own Quantity type, to keep
// apimachinery out of it; this test holds ParseQuantity to that type's
// answers (only the test imports it).
func TestParseQuantityAsKubernetes(t *testing.T) {
	for _, s := range []string{"0", "1", "100", "15Gi", "16106127360", "6442450944", "1Mi", "3Gi", "512Ki",
		"1.5Gi", "0.5", "1.5", "1500m", "1m", "999m", "1k", "1M", "2G", "7T", "1P", "3E", "1Ei", "7Ei",
		"5e3", "5E3", "1e-3", "1.5e2", "+5", "-5", "-1.5", "-1m", ".5", "5.", "0.000001", "12n", "3u", "1e18", "9e18"} {
		want := resource.MustParse(s)
		got, err := ParseQuantity(s)
		if err != nil {
			t.Errorf("%q: %v", s, err)
			continue
		}
		if got != want.Value() {
			t.Errorf("%q: %d, Kubernetes says %d", s, got, want.Value())
		}
	}
	for _, s := range []string{"", "Gi", "1GiB", "1 Gi", "1.2.3", "--1", "1e", "1e1000", "1x", "0x10", "1Ei0",
		"99999999999Ei", strings.Repeat("9", 100)} {
		if got, err := ParseQuantity(s); err == nil {
			t.Errorf("%q read as %d, want an error", s, got)
		}
	}
}

// FuzzParseQuantity: whatever the API or a hostile stand-in writes, the
// parser agrees with Kubernetes' where Kubernetes reads it, and never
// takes what Kubernetes refuses.
func FuzzParseQuantity(f *testing.F) {
	for _, s := range []string{"15Gi", "1.5e2", "-1m", "1Ei", "9e18"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseQuantity(s)
		want, kerr := resource.ParseQuantity(s)
		if kerr != nil {
			if err == nil {
				t.Fatalf("%q read as %d; Kubernetes refuses it: %v", s, got, kerr)
			}
			return
		}
		if err == nil && got != want.Value() {
			t.Fatalf("%q: %d, Kubernetes says %d", s, got, want.Value())
		}
	})
}
