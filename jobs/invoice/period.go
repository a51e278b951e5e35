package invoice

import (
	"fmt"
	"time"

	"github.com/fenceq/fenceq/queue"
)

// ValidatePeriod checks a billing period: a calendar month written YYYY-MM, e.g.
// "2025-01". The error matches queue.ErrInvalid and names the field.
func ValidatePeriod(period string) error {
	if len(period) != 7 || period[4] != '-' {
		return &queue.ValidationError{Field: "period", Reason: fmt.Sprintf("%q must be YYYY-MM, e.g. 2025-01", period)}
	}
	for i, c := range period {
		if i != 4 && (c < '0' || c > '9') {
			return &queue.ValidationError{Field: "period", Reason: fmt.Sprintf("%q must be YYYY-MM, e.g. 2025-01", period)}
		}
	}
	if _, err := time.Parse("2006-01", period); err != nil {
		return &queue.ValidationError{Field: "period", Reason: fmt.Sprintf("%q is not a calendar month (YYYY-MM with month 01–12)", period)}
	}
	if period < "1970-01" {
		return &queue.ValidationError{Field: "period", Reason: fmt.Sprintf("%q is before 1970-01", period)}
	}
	return nil
}

// PreviousPeriod returns the calendar month (UTC) before the one t falls in, as
// YYYY-MM: the period a billing run bills unless told otherwise.
func PreviousPeriod(t time.Time) string {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC).AddDate(0, -1, 0).Format("2006-01")
}
