package main

import "github.com/devicegate/devicegate/internal/buildinfo"

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

// versionInfo is what `gateway version` prints.
type versionInfo = buildinfo.Info

// buildVersion reads the version from the build information and the
// -ldflags variables.
func buildVersion() versionInfo {
	return buildinfo.Current(buildinfo.Linked{Version: version, Revision: revision, Time: revisionTime})
}

// releaseName is the version alone, as the start-up log gives it.
func releaseName() string { return buildVersion().Version }
