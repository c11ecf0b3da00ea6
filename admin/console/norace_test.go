//go:build !race

package console_test

// raceSlowdown: see race_test.go.
const raceSlowdown = 1
