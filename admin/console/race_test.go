//go:build race

package console_test

// raceSlowdown is how much slower the race detector makes the code
// (about 10 times): the scale test shrinks by it and checks no time
// bound; `make console-scale` runs it without the detector.
const raceSlowdown = 10
