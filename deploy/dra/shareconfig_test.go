package dra

import (
	"strings"
	"testing"
)

func TestDecodeShareConfig(t *testing.T) {
	head := `"apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "ShareConfig"`
	good := []struct {
		in            string
		weight, limit int
		priority      string
	}{
		{`{` + head + `}`, 0, 0, ""},
		{`{` + head + `, "weight": 2}`, 2, 0, ""},
		{`{` + head + `, "weight": 1000, "computeLimit": 100, "priority": "high"}`, 1000, 100, "high"},
		{`{` + head + `, "priority": "normal", "computeLimit": 1}`, 0, 1, "normal"},
	}
	for _, c := range good {
		got, err := DecodeShareConfig([]byte(c.in))
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if w := deref(got.Weight); w != c.weight {
			t.Errorf("%s: weight %d, want %d", c.in, w, c.weight)
		}
		if l := deref(got.ComputeLimit); l != c.limit {
			t.Errorf("%s: computeLimit %d, want %d", c.in, l, c.limit)
		}
		if p := derefs(got.Priority); p != c.priority {
			t.Errorf("%s: priority %q, want %q", c.in, p, c.priority)
		}
	}
	bad := []struct{ in, why string }{
		{`{` + head + `, "weight": 0}`, "weight 0: want an integer from 1 to 1000"},
		{`{` + head + `, "weight": 1001}`, "weight 1001"},
		{`{` + head + `, "weight": -1}`, "weight -1"},
		{`{` + head + `, "weight": 1.5}`, "cannot unmarshal"},
		{`{` + head + `, "weight": "2"}`, "cannot unmarshal"},
		{`{` + head + `, "computeLimit": 0}`, "computeLimit 0"},
		{`{` + head + `, "computeLimit": 101}`, "computeLimit 101"},
		{`{` + head + `, "priority": "urgent"}`, `priority "urgent": want high or normal`},
		{`{` + head + `, "priority": "` + strings.Repeat("x", 500) + `"}`, "priority (500 bytes)"},
		{`{` + head + `, "wieght": 2}`, `unknown field "wieght"`},
		{`{` + head + `} {}`, "more than one JSON value"},
		{`{"apiVersion": "gpu.gpuwarden.io/v1", "kind": "ShareConfig"}`, "want gpu.gpuwarden.io/v1alpha1, ShareConfig"},
		{`{"apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "Share"}`, "want gpu.gpuwarden.io/v1alpha1, ShareConfig"},
		{`{` + head + `, "weight": 0, "computeLimit": 500}`, "computeLimit 500"}, // every bad value named
		{`[]`, "cannot unmarshal"},
		{``, "EOF"},
		{`{` + head + `, "x": "` + strings.Repeat("y", 5000) + `"}`, "more than 4096"},
	}
	for _, c := range bad {
		_, err := DecodeShareConfig([]byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%.80s: error %v, want one saying %q", c.in, err, c.why)
		}
	}
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

func derefs(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// FuzzDecodeShareConfig: whatever a claim's author writes, decoding either
// fails or yields settings the enforcer accepts.
func FuzzDecodeShareConfig(f *testing.F) {
	f.Add([]byte(`{"apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "ShareConfig", "weight": 2, "priority": "high", "computeLimit": 50}`))
	f.Add([]byte(`{"apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "ShareConfig", "weight": 0}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeShareConfig(b)
		if err != nil {
			return
		}
		if c.Weight != nil && (*c.Weight < 1 || *c.Weight > 1000) {
			t.Fatalf("weight %d accepted", *c.Weight)
		}
		if c.ComputeLimit != nil && (*c.ComputeLimit < 1 || *c.ComputeLimit > 100) {
			t.Fatalf("computeLimit %d accepted", *c.ComputeLimit)
		}
		if c.Priority != nil && *c.Priority != "high" && *c.Priority != "normal" {
			t.Fatalf("priority %q accepted", *c.Priority)
		}
	})
}
