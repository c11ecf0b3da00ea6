package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// TestRead: the linker's version wins over the module's; the build
// info's commit wins over the linker's; GOARM names the ARM version;
// nothing at all is "dev".
func TestRead(t *testing.T) {
	plat := runtime.GOOS + "/" + runtime.GOARCH
	if v := Read(nil, Linked{}); v.Version != "dev" || v.Revision != "" || v.Platform != plat {
		t.Fatalf("nothing: %+v", v)
	}
	if v := Read(nil, Linked{"v1.2.3", "abc", "2026-01-02T03:04:05Z"}); v.Version != "v1.2.3" || v.Revision != "abc" || v.Time != "2026-01-02T03:04:05Z" {
		t.Fatalf("linked only: %+v", v)
	}
	bi := &debug.BuildInfo{Main: debug.Module{Version: "v0.9.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "def"}, {Key: "vcs.time", Value: "2026-02-03T00:00:00Z"}, {Key: "vcs.modified", Value: "true"}, {Key: "GOARM", Value: "7,softfloat"},
	}}
	v := Read(bi, Linked{Revision: "abc"})
	if v.Version != "v0.9.0" || v.Revision != "def" || v.Time != "2026-02-03T00:00:00Z" || !v.Modified || v.Platform != plat+"/v7" {
		t.Fatalf("build info: %+v", v)
	}
	if v := Read(&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Linked{}); v.Version != "dev" {
		t.Fatalf("(devel): %+v", v)
	}
	if v := Read(bi, Linked{Version: "v2.0.0"}); v.Version != "v2.0.0" {
		t.Fatalf("linked over module: %+v", v)
	}
}

func TestString(t *testing.T) {
	v := Info{Version: "v1.2.3", Revision: "abc", Time: "2026-01-02T03:04:05Z", Modified: true, Go: "go1.26.0", Platform: "linux/arm/v7"}
	if got, want := v.String(), "devicegate v1.2.3 (go1.26.0 linux/arm/v7)\nrevision abc (modified)\ntime 2026-01-02T03:04:05Z\n"; got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
	if got, want := (Info{Version: "dev", Go: "go1.26.0", Platform: "linux/amd64"}).String(), "devicegate dev (go1.26.0 linux/amd64)\n"; got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
}
