//go:build !linux

package cli

import (
	"io"
	"os"
)

// isTerminal reports whether r is a character device other than the null device,
// where an operator can answer a prompt.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok || f.Name() == os.DevNull {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
