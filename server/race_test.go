//go:build race

package server

// raceSlowdown is how much slower the race detector makes the code
// timed against a bound (about 10 times); `make test` also runs the
// timed tests without it.
const raceSlowdown = 10
