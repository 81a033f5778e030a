package dra

import (
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
)

// Quantity is a Kubernetes resource quantity ("15Gi", "100", "1.5k",
// "6442450944", "5e3"), held as its integer value, rounded up as the API's
// own Quantity.Value rounds. It is written as a plain integer, which the
// API server reads as the same quantity.
type Quantity int64

// maxQuantityLen bounds what is parsed: no quantity the API writes is longer.
const maxQuantityLen = 64

var quantitySuffixes = map[string]*big.Rat{
	"": big.NewRat(1, 1), "n": big.NewRat(1, 1e9), "u": big.NewRat(1, 1e6), "m": big.NewRat(1, 1e3),
	"k": big.NewRat(1e3, 1), "M": big.NewRat(1e6, 1), "G": big.NewRat(1e9, 1), "T": big.NewRat(1e12, 1),
	"P": big.NewRat(1e15, 1), "E": big.NewRat(1e18, 1),
	"Ki": big.NewRat(1<<10, 1), "Mi": big.NewRat(1<<20, 1), "Gi": big.NewRat(1<<30, 1), "Ti": big.NewRat(1<<40, 1),
	"Pi": big.NewRat(1<<50, 1), "Ei": big.NewRat(1<<60, 1),
}

// ParseQuantity reads a quantity in the API's grammar: a signed decimal
// number (digits, with a fraction or not) and a binary (Ki-Ei) or decimal
// (n, u, m, k, M-E) suffix, or an exponent (e or E and a signed integer).
func ParseQuantity(s string) (Quantity, error) {
	bad := func(why string) (Quantity, error) {
		if len(s) > maxQuantityLen {
			return 0, fmt.Errorf("quantity of %d bytes: %s", len(s), why)
		}
		return 0, fmt.Errorf("quantity %q: %s", s, why)
	}
	if len(s) == 0 || len(s) > maxQuantityLen {
		return bad("want a number such as 15Gi or 100")
	}
	end := strings.IndexFunc(s, func(r rune) bool { return !strings.ContainsRune("+-0123456789.", r) })
	if end < 0 {
		end = len(s)
	}
	num, suffix := s[:end], s[end:]
	digits := strings.TrimLeft(num, "+-")
	if len(num)-len(digits) > 1 || digits == "" || digits == "." || strings.Count(digits, ".") > 1 ||
		strings.ContainsAny(digits, "+-") {
		return bad("want a number such as 15Gi or 100")
	}
	v, ok := new(big.Rat).SetString(strings.TrimPrefix(num, "+"))
	if !ok {
		return bad("want a number such as 15Gi or 100")
	}
	if m, ok := quantitySuffixes[suffix]; ok {
		v.Mul(v, m)
	} else if suffix[0] == 'e' || suffix[0] == 'E' {
		n, err := parseExponent(suffix[1:])
		if err != nil {
			return bad(err.Error())
		}
		p := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(max(n, -n))), nil))
		if n < 0 {
			p.Inv(p)
		}
		v.Mul(v, p)
	} else {
		return bad(fmt.Sprintf("unknown suffix %q", suffix))
	}
	// Rounded up, away from zero, as Quantity.Value rounds.
	q, r := new(big.Int).QuoRem(v.Num(), v.Denom(), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	} else if r.Sign() < 0 {
		q.Sub(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return bad("out of range")
	}
	return Quantity(q.Int64()), nil
}

// parseExponent reads a quantity's exponent: a signed integer of at most
// three digits (a larger one is out of range whatever the number).
func parseExponent(s string) (int, error) {
	sign := 1
	if t, ok := strings.CutPrefix(s, "-"); ok {
		s, sign = t, -1
	} else {
		s = strings.TrimPrefix(s, "+")
	}
	if s == "" || len(s) > 3 || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("exponent %q: want a signed integer", s)
	}
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return sign * n, nil
}

func (q Quantity) MarshalJSON() ([]byte, error) { return json.Marshal(fmt.Sprint(int64(q))) }

func (q *Quantity) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("quantity: %w", err)
	}
	v, err := ParseQuantity(s)
	if err != nil {
		return err
	}
	*q = v
	return nil
}
