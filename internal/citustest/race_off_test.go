//go:build !race

package citustest

const raceEnabled = false
