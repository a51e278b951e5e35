package fenceq_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: workers must stop
// every goroutine they start.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
