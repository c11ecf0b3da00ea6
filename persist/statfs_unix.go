//go:build linux || darwin || freebsd

package persist

import "golang.org/x/sys/unix"

// diskFree returns the bytes of dir's filesystem available to the
// process (statfs: available blocks times the block size; the blocks
// kept for root are not counted). ok is false where it cannot be known.
func diskFree(dir string) (free int64, ok bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true // the field types differ by system
}
