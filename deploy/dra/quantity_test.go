package dra

import (
	"encoding/json"
	"testing"
)

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
