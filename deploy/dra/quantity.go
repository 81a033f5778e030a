package dra

import (
	"encoding/json"
	"fmt"

	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// Quantity is a Kubernetes resource quantity held as its integer value
// (vocab.ParseQuantity reads it). It is written as a plain integer, which
// the API server reads as the same quantity.
type Quantity int64

func (q Quantity) MarshalJSON() ([]byte, error) { return json.Marshal(fmt.Sprint(int64(q))) }

func (q *Quantity) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("quantity: %w", err)
	}
	v, err := vocab.ParseQuantity(s)
	if err != nil {
		return err
	}
	*q = Quantity(v)
	return nil
}
