package main

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestRelease runs `make release` into a temporary directory and checks
// each binary: built for its platform without cgo and with -trimpath
// (go version -m), stamped with the version (its string is in the
// binary), statically linked (no ELF interpreter), listed in SHA256SUMS with its digest; the one for this
// machine's platform prints its version. Three cross-compilations take
// minutes: it runs under `make test-release`
// (DEVICEGATE_RELEASE_TEST=1), not in make test.
func TestRelease(t *testing.T) {
	if os.Getenv("DEVICEGATE_RELEASE_TEST") == "" {
		t.Skip("cross-compiles three targets; run make test-release")
	}
	const v = "v9.9.9-release"
	dist := t.TempDir()
	root := filepath.Dir(filepath.Dir(sourceDir))
	mk := exec.Command("make", "--no-print-directory", "release", "DIST="+dist, "VERSION="+v)
	mk.Dir = root
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]string{ // binary: build settings
		"gateway-" + v + "-linux-amd64": {"GOARCH": "amd64"},
		"gateway-" + v + "-linux-arm64": {"GOARCH": "arm64"},
		"gateway-" + v + "-linux-armv7": {"GOARCH": "arm", "GOARM": "7"},
	}
	lines := strings.Split(strings.TrimSpace(string(sums)), "\n")
	if len(lines) != len(want) {
		t.Fatalf("SHA256SUMS has %d lines, want %d:\n%s", len(lines), len(want), sums)
	}
	for _, line := range lines {
		digest, name, _ := strings.Cut(line, "  ")
		settings, ok := want[name]
		if !ok {
			t.Errorf("SHA256SUMS lists %q", name)
			continue
		}
		path := filepath.Join(dist, name)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != digest {
			t.Errorf("%s: SHA256SUMS says %s, the file is %x", name, digest, sum)
		}
		out, err := exec.Command("go", "version", "-m", path).Output()
		if err != nil {
			t.Fatalf("go version -m %s: %v", name, err)
		}
		info := string(out)
		settings["GOOS"], settings["CGO_ENABLED"], settings["-trimpath"] = "linux", "0", "true"
		for k, val := range settings {
			if !strings.Contains(info, "\tbuild\t"+k+"="+val+"\n") {
				t.Errorf("%s: build info lacks %s=%s:\n%s", name, k, val, info)
			}
		}
		// With -trimpath the go command leaves -ldflags out of the build
		// information: the stamped version is found in the binary.
		if !bytes.Contains(data, []byte(v)) {
			t.Errorf("%s: not stamped with %s", name, v)
		}
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s: dynamically linked (has an ELF interpreter)", name)
			}
		}
		f.Close()
		if settings["GOARCH"] == runtime.GOARCH && runtime.GOOS == "linux" {
			out, err := exec.Command(path, "version").Output()
			if err != nil || !strings.HasPrefix(string(out), "devicegate "+v+" (") || !strings.Contains(string(out), "linux/"+runtime.GOARCH+")") {
				t.Errorf("%s version: %q, %v", name, out, err)
			}
		}
		t.Logf("%s: %d bytes", name, len(data))
	}
}
