package vocab

import (
	"fmt"
	"math/big"
	"strings"
)

// wantQuantity says what a quantity is.
const wantQuantity = "a Kubernetes quantity such as 15Gi, 100 or 1.5k"

// maxQuantityLen bounds what is parsed: no quantity the API writes is longer.
const maxQuantityLen = 64

var quantitySuffixes = map[string]*big.Rat{
	"": big.NewRat(1, 1), "n": big.NewRat(1, 1e9), "u": big.NewRat(1, 1e6), "m": big.NewRat(1, 1e3),
	"k": big.NewRat(1e3, 1), "M": big.NewRat(1e6, 1), "G": big.NewRat(1e9, 1), "T": big.NewRat(1e12, 1),
	"P": big.NewRat(1e15, 1), "E": big.NewRat(1e18, 1),
	"Ki": big.NewRat(1<<10, 1), "Mi": big.NewRat(1<<20, 1), "Gi": big.NewRat(1<<30, 1), "Ti": big.NewRat(1<<40, 1),
	"Pi": big.NewRat(1<<50, 1), "Ei": big.NewRat(1<<60, 1),
}

// ParseQuantity reads a Kubernetes resource quantity ("15Gi", "100",
// "1.5k", "6442450944", "5e3") as the API writes them: a signed decimal
// number (digits, with a fraction or not) and a binary (Ki-Ei) or decimal
// (n, u, m, k, M-E) suffix, or an exponent (e or E and a signed integer).
// Its value is rounded up, as Kubernetes' Quantity.Value rounds.
func ParseQuantity(s string) (int64, error) {
	bad := func(why string) (int64, error) {
		return 0, &Error{Setting: "quantity", Value: s, Why: why, Want: wantQuantity}
	}
	if len(s) == 0 || len(s) > maxQuantityLen {
		return bad("")
	}
	end := strings.IndexFunc(s, func(r rune) bool { return !strings.ContainsRune("+-0123456789.", r) })
	if end < 0 {
		end = len(s)
	}
	num, suffix := s[:end], s[end:]
	digits := strings.TrimLeft(num, "+-")
	if len(num)-len(digits) > 1 || digits == "" || digits == "." || strings.Count(digits, ".") > 1 ||
		strings.ContainsAny(digits, "+-") {
		return bad("")
	}
	v, ok := new(big.Rat).SetString(strings.TrimPrefix(num, "+"))
	if !ok {
		return bad("")
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
	return q.Int64(), nil
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
		return 0, fmt.Errorf("exponent %q is not a signed integer of at most 3 digits", s)
	}
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return sign * n, nil
}
