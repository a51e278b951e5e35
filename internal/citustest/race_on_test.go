//go:build race

package citustest

// raceEnabled: this test binary was built with -race, so the suite it runs again is.
const raceEnabled = true
