package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is the release name, set at build time with
// -ldflags "-X main.version=v1.2.3" (make build, make release); when
// empty, the module version from the build info, or "dev".
var version = ""

// revision and revisionTime are the commit and its time, set by make
// with -ldflags beside version. Go records them in the build info
// itself when it builds in a git checkout, but not in a git worktree
// (its .git is a file, which the go command does not take for a
// repository) nor with -buildvcs=false; the build info wins when it
// has them.
var revision, revisionTime = "", ""

const versionUsage = `Usage: gateway version   (or gateway --version)

Prints the version of devicegate, the commit it was built from and when
that commit was made, and the Go toolchain and platform, all read from
the binary's build information: a binary from "go build" or
"go install" says them as a release build does.
`

// versionInfo is what `gateway version` prints, from the binary's build
// information.
type versionInfo struct {
	Version  string // release name: -ldflags, else the module version, else "dev"
	Revision string // VCS commit, "" when the build did not record one
	Time     string // the commit's time, RFC 3339
	Modified bool   // built from a tree with uncommitted changes
	Go       string // toolchain, e.g. go1.26.0
	Platform string // GOOS/GOARCH, with the ARM version: linux/arm/v7
}

// buildVersion reads the version from the build information.
func buildVersion() versionInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return readVersion(bi)
}

// readVersion reads the version from bi (nil: none) and the -ldflags
// variables.
func readVersion(bi *debug.BuildInfo) versionInfo {
	v := versionInfo{Version: version, Revision: revision, Time: revisionTime, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
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
func (v versionInfo) String() string {
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

// releaseName is the version alone, as the start-up log gives it.
func releaseName() string { return buildVersion().Version }
