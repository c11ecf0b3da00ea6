// Package buildinfo reads what `gateway version` prints from a binary's
// build information and the variables make sets with -ldflags
// (cmd/gateway/version.go holds those).
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Info is what `gateway version` prints.
type Info struct {
	Version  string // release name: -ldflags, else the module version, else "dev"
	Revision string // VCS commit, "" when the build did not record one
	Time     string // the commit's time, RFC 3339
	Modified bool   // built from a tree with uncommitted changes
	Go       string // toolchain, e.g. go1.26.0
	Platform string // GOOS/GOARCH, with the ARM version: linux/arm/v7
}

// Linked is what the linker set: the release name, the commit and its
// time (any of them "").
type Linked struct{ Version, Revision, Time string }

// Current reads this binary's build information.
func Current(l Linked) Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return Read(bi, l)
}

// Read reads the version from bi (nil: none) and l. Go records the
// commit in the build info when it builds in a git checkout, but not in
// a git worktree nor with -buildvcs=false; the build info wins when it
// has them.
func Read(bi *debug.BuildInfo, l Linked) Info {
	v := Info{Version: l.Version, Revision: l.Revision, Time: l.Time, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Revision = s.Value
			case "vcs.time":
				v.Time = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			case "GOARM":
				v.Platform += "/v" + strings.TrimSuffix(strings.SplitN(s.Value, ",", 2)[0], "v")
			}
		}
	}
	if v.Version == "" {
		v.Version = "dev"
	}
	return v
}

// String is the printed form: the version and toolchain on the first
// line, "devicegate v1.2.3 (go1.26.0 linux/amd64)", then the commit and
// its time when the build recorded them.
func (v Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "devicegate %s (%s %s)\n", v.Version, v.Go, v.Platform)
	if v.Revision != "" {
		mod := ""
		if v.Modified {
			mod = " (modified)"
		}
		fmt.Fprintf(&b, "revision %s%s\n", v.Revision, mod)
	}
	if v.Time != "" {
		fmt.Fprintf(&b, "time %s\n", v.Time)
	}
	return b.String()
}
