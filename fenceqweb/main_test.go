package fenceqweb

import (
	"testing"

	"github.com/fenceq/fenceq/fenceqtest"
)

// TestMain removes the throwaway cluster a test may have started.
func TestMain(m *testing.M) { fenceqtest.Main(m) }
