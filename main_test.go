package fenceq_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/fenceq/fenceq/fenceqtest"
)

// TestMain fails the package if any test leaves a goroutine behind (workers must stop
// every goroutine they start), and stops the throwaway PostgreSQL cluster when the
// tests started one.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(fenceqtest.WrapM(m))
}
