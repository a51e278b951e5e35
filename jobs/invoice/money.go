package invoice

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// Money is integer minor units (cents for USD/EUR) in int64 everywhere: amounts are
// never floating point, and every product or sum is checked for overflow.
//
// # Rounding rule
//
// Tax is computed once per invoice, on the subtotal (not per line):
//
//	tax_cents = floor((subtotal_cents × rate_micros + 500000) / 1000000)
//
// where rate_micros is the tax rate in millionths (72500 = 7.25 %). That is rounding
// half up to the cent; amounts are never negative, so it is also half away from zero,
// the same as PostgreSQL's round() on numeric. The product is computed in 128 bits.

// MaxTaxRateMicros is the highest accepted tax rate: 100 %.
const MaxTaxRateMicros = 1_000_000

// ErrOverflow means an amount does not fit in int64 minor units.
var ErrOverflow = errors.New("amount overflows int64 minor units")

// Line is one line of an invoice.
type Line struct {
	SKU            string `json:"sku"`
	Description    string `json:"description"`
	Quantity       int64  `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
	AmountCents    int64  `json:"amount_cents"`
}

// Totals are an invoice's amounts.
type Totals struct {
	SubtotalCents int64 `json:"subtotal_cents"`
	TaxRateMicros int64 `json:"tax_rate_micros"`
	TaxCents      int64 `json:"tax_cents"`
	TotalCents    int64 `json:"total_cents"`
}

// LineAmount returns quantity × unit price, or ErrOverflow.
func LineAmount(quantity, unitPriceCents int64) (int64, error) {
	if quantity < 0 || unitPriceCents < 0 {
		return 0, fmt.Errorf("line amount: quantity %d and unit price %d must not be negative", quantity, unitPriceCents)
	}
	hi, lo := bits.Mul64(uint64(quantity), uint64(unitPriceCents))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, fmt.Errorf("line amount %d × %d: %w", quantity, unitPriceCents, ErrOverflow)
	}
	return int64(lo), nil
}

// TaxCents applies the rounding rule above.
func TaxCents(subtotalCents, rateMicros int64) (int64, error) {
	if subtotalCents < 0 {
		return 0, fmt.Errorf("tax: subtotal %d must not be negative", subtotalCents)
	}
	if rateMicros < 0 || rateMicros > MaxTaxRateMicros {
		return 0, fmt.Errorf("tax: rate %d millionths is outside 0–%d", rateMicros, MaxTaxRateMicros)
	}
	hi, lo := bits.Mul64(uint64(subtotalCents), uint64(rateMicros))
	lo, carry := bits.Add64(lo, 500_000, 0)
	hi += carry
	// The quotient fits in 64 bits because hi < divisor (rate ≤ 100 % keeps the tax at
	// most the subtotal).
	q, _ := bits.Div64(hi, lo, 1_000_000)
	if q > math.MaxInt64 {
		return 0, fmt.Errorf("tax on %d: %w", subtotalCents, ErrOverflow)
	}
	return int64(q), nil
}

// ComputeTotals fills each line's amount and returns the invoice totals at the given
// tax rate.
func ComputeTotals(lines []Line, rateMicros int64) (Totals, error) {
	t := Totals{TaxRateMicros: rateMicros}
	for i := range lines {
		amt, err := LineAmount(lines[i].Quantity, lines[i].UnitPriceCents)
		if err != nil {
			return Totals{}, fmt.Errorf("line %d (%s): %w", i+1, lines[i].SKU, err)
		}
		lines[i].AmountCents = amt
		if t.SubtotalCents > math.MaxInt64-amt {
			return Totals{}, fmt.Errorf("subtotal at line %d: %w", i+1, ErrOverflow)
		}
		t.SubtotalCents += amt
	}
	tax, err := TaxCents(t.SubtotalCents, rateMicros)
	if err != nil {
		return Totals{}, err
	}
	if t.SubtotalCents > math.MaxInt64-tax {
		return Totals{}, fmt.Errorf("total: %w", ErrOverflow)
	}
	t.TaxCents, t.TotalCents = tax, t.SubtotalCents+tax
	return t, nil
}

// FormatCents renders minor units with two decimals: 123456 → "1234.56". It assumes a
// currency with two decimal places.
func FormatCents(c int64) string {
	sign := ""
	u := uint64(c)
	if c < 0 {
		sign, u = "-", uint64(-(c+1))+1
	}
	return fmt.Sprintf("%s%d.%02d", sign, u/100, u%100)
}

// FormatRate renders a rate in millionths as a percentage: 72500 → "7.25%".
func FormatRate(micros int64) string {
	whole, frac := micros/10_000, micros%10_000
	s := fmt.Sprintf("%d.%04d", whole, frac)
	for s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	if s[len(s)-1] == '.' {
		s = s[:len(s)-1]
	}
	return s + "%"
}
