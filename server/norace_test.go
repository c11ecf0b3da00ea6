//go:build !race

package server

// raceSlowdown: see race_test.go.
const raceSlowdown = 1
