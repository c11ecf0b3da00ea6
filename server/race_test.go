//go:build race

package server

// raceSlowdown is how much slower the race detector makes the code
// (about 10 times): timed tests shrink by it and check no time bound;
// `make test` also runs them without the detector.
const raceSlowdown = 10
