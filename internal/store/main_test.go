package store_test

import (
	"testing"

	"github.com/fenceq/fenceq/fenceqtest"
)

// TestMain stops the throwaway PostgreSQL cluster when the tests started one.
func TestMain(m *testing.M) { fenceqtest.Main(m) }
