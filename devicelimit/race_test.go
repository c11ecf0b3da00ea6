//go:build race

package devicelimit

// raceScale divides the sequences of the property tests under the race
// detector (about 12 times slower); `make test` also runs
// them in full without it.
const raceScale = 10
