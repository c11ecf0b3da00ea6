//go:build !race

package devicelimit

// raceScale: see race_test.go.
const raceScale = 1
