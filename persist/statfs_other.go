//go:build !(linux || darwin || freebsd)

package persist

// diskFree cannot know the free space here: the floor
// (Options.MinFreeBytes) is not enforced.
func diskFree(string) (int64, bool) { return 0, false }
