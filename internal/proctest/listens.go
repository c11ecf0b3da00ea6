package proctest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// listens reports whether process pid holds a TCP socket listening on
// addr's port (Linux: the listening sockets' inodes in /proc/net/tcp
// and tcp6 among the process's open files). Elsewhere it reports true:
// the ready check alone decides.
func listens(pid int, addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return false
	}
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		return true
	}
	inodes := map[string]bool{}
	suffix := fmt.Sprintf(":%04X", n)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fs := strings.Fields(line)
			if len(fs) > 9 && strings.HasSuffix(fs[1], suffix) && fs[3] == "0A" {
				inodes["socket:["+fs[9]+"]"] = true
			}
		}
	}
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	for _, fd := range fds {
		if link, err := os.Readlink(fd); err == nil && inodes[link] {
			return true
		}
	}
	return false
}
