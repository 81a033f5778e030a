package dra

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// The driver reads quantities without Kubernetes' own Quantity type, to keep
// apimachinery out of the agent; this test holds it to that type's answers.
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
		if int64(got) != want.Value() {
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

func TestQuantityJSON(t *testing.T) {
	var q struct{ A, B Quantity }
	if err := json.Unmarshal([]byte(`{"A": "15Gi", "B": "50"}`), &q); err != nil || q.A != 15<<30 || q.B != 50 {
		t.Fatalf("%+v, %v", q, err)
	}
	b, _ := json.Marshal(q)
	if string(b) != `{"A":"16106127360","B":"50"}` {
		t.Errorf("written as %s", b)
	}
	if err := json.Unmarshal([]byte(`{"A": 15}`), &q); err == nil {
		t.Error("a bare number read as a quantity")
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
		if err == nil && int64(got) != want.Value() {
			t.Fatalf("%q: %d, Kubernetes says %d", s, got, want.Value())
		}
	})
}
