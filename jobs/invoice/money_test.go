package invoice_test

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fenceq/fenceq/jobs/invoice"
)

func TestTaxRoundsHalfUpToTheCent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		subtotal, rate, want int64
	}{
		{0, 190_000, 0},
		{1, 500_000, 1},                    // 0.5 cent rounds up
		{1, 499_999, 0},                    // 0.499999 cent rounds down
		{333, 72_500, 24},                  // 24.1425
		{1_000, 88_750, 89},                // 88.75 (8.875 %)
		{10_000, 72_500, 725},              // exact
		{19_999, 190_000, 3_800},           // 3799.81
		{123_456_789, 200_000, 24_691_358}, // 24691357.8
		{100, 0, 0},
		{42, 1_000_000, 42}, // 100 %
		{math.MaxInt64 / 2, 1_000_000, math.MaxInt64 / 2},
	} {
		got, err := invoice.TaxCents(tc.subtotal, tc.rate)
		if err != nil || got != tc.want {
			t.Errorf("TaxCents(%d, %d) = %d, %v; want %d", tc.subtotal, tc.rate, got, err, tc.want)
		}
	}
	for _, bad := range [][2]int64{{-1, 1000}, {1, -1}, {1, 1_000_001}} {
		if _, err := invoice.TaxCents(bad[0], bad[1]); err == nil {
			t.Errorf("TaxCents(%d, %d) accepted", bad[0], bad[1])
		}
	}
}

// The 128-bit computation agrees with arbitrary-precision arithmetic everywhere.
func TestTaxMatchesBigIntegerArithmetic(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	million := big.NewInt(1_000_000)
	half := big.NewInt(500_000)
	for range 20_000 {
		subtotal := rng.Int64N(math.MaxInt64)
		if rng.IntN(2) == 0 {
			subtotal = rng.Int64N(10_000_000)
		}
		rate := rng.Int64N(invoice.MaxTaxRateMicros + 1)
		want := new(big.Int).Mul(big.NewInt(subtotal), big.NewInt(rate))
		want.Add(want, half).Quo(want, million)
		got, err := invoice.TaxCents(subtotal, rate)
		if err != nil || !want.IsInt64() || got != want.Int64() {
			t.Fatalf("TaxCents(%d, %d) = %d, %v; want %s", subtotal, rate, got, err, want)
		}
	}
}

func TestComputeTotalsIsExact(t *testing.T) {
	t.Parallel()
	lines := []invoice.Line{
		{SKU: "api-calls", Quantity: 12_345, UnitPriceCents: 37},
		{SKU: "seats", Quantity: 7, UnitPriceCents: 1_500},
		{SKU: "storage-gb", Quantity: 0, UnitPriceCents: 23},
	}
	got, err := invoice.ComputeTotals(lines, 72_500)
	if err != nil {
		t.Fatal(err)
	}
	// 456765 + 10500 + 0 = 467265; tax 467265 × 0.0725 = 33876.7125 → 33877.
	want := invoice.Totals{SubtotalCents: 467_265, TaxRateMicros: 72_500, TaxCents: 33_877, TotalCents: 501_142}
	if got != want {
		t.Fatalf("totals = %+v, want %+v", got, want)
	}
	if lines[0].AmountCents != 456_765 || lines[1].AmountCents != 10_500 || lines[2].AmountCents != 0 {
		t.Fatalf("line amounts: %+v", lines)
	}
	if empty, err := invoice.ComputeTotals(nil, 190_000); err != nil || empty != (invoice.Totals{TaxRateMicros: 190_000}) {
		t.Fatalf("empty invoice: %+v %v", empty, err)
	}
	for name, ls := range map[string][]invoice.Line{
		"LineOverflow":     {{Quantity: math.MaxInt64 / 2, UnitPriceCents: 3}},
		"SubtotalOverflow": {{Quantity: 1, UnitPriceCents: math.MaxInt64}, {Quantity: 1, UnitPriceCents: 1}},
	} {
		if _, err := invoice.ComputeTotals(ls, 0); !errors.Is(err, invoice.ErrOverflow) {
			t.Errorf("%s: %v, want ErrOverflow", name, err)
		}
	}
	if _, err := invoice.ComputeTotals([]invoice.Line{{Quantity: -1, UnitPriceCents: 5}}, 0); err == nil {
		t.Error("negative quantity accepted")
	}
	if _, err := invoice.ComputeTotals([]invoice.Line{{Quantity: 1, UnitPriceCents: math.MaxInt64}}, 1_000_000); !errors.Is(err, invoice.ErrOverflow) {
		t.Errorf("total overflow: %v", err)
	}
}

func TestFormatting(t *testing.T) {
	t.Parallel()
	for c, want := range map[int64]string{0: "0.00", 5: "0.05", 123_456: "1234.56", -250: "-2.50", math.MinInt64: "-92233720368547758.08"} {
		if got := invoice.FormatCents(c); got != want {
			t.Errorf("FormatCents(%d) = %q, want %q", c, got, want)
		}
	}
	for r, want := range map[int64]string{72_500: "7.25%", 190_000: "19%", 88_750: "8.875%", 0: "0%", 1: "0.0001%"} {
		if got := invoice.FormatRate(r); got != want {
			t.Errorf("FormatRate(%d) = %q, want %q", r, got, want)
		}
	}
}

func TestValidatePeriod(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"2025-01", "2024-12", "1999-07"} {
		if err := invoice.ValidatePeriod(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "2025-1", "2025-13", "2025-00", "25-01", "2025/01", "2025-01-01", "abcd-ef", "2025-0a", " 2025-01", "1969-12", "２０２５-01"} {
		err := invoice.ValidatePeriod(bad)
		if err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestPreviousPeriod(t *testing.T) {
	t.Parallel()
	east := time.FixedZone("UTC+3", 3*3600)
	for _, c := range []struct {
		t    time.Time
		want string
	}{
		{time.Date(2026, 3, 15, 12, 0, 0, 0, time.UTC), "2026-02"},
		{time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), "2025-12"},
		{time.Date(2026, 3, 31, 23, 59, 0, 0, time.UTC), "2026-02"},
		// 1 March 01:00 at UTC+3 is still February in UTC.
		{time.Date(2026, 3, 1, 1, 0, 0, 0, east), "2026-01"},
	} {
		if got := invoice.PreviousPeriod(c.t); got != c.want {
			t.Errorf("PreviousPeriod(%s) = %s, want %s", c.t, got, c.want)
		}
	}
}
