package main

import (
	"archive/zip"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// modulePath is the module's path, which `go install PATH/cmd/gateway@V`
// fetches.
const modulePath = "github.com/devicegate/devicegate"

// TestGoInstall proves `go install github.com/devicegate/devicegate/cmd/gateway@VERSION`
// works as it will once the repository is published: it writes the
// working tree's tracked files as a module version into a file-based
// module proxy (GOPROXY=file://DIR, the layout the go command fetches
// from: @v/list, .info, .mod, .zip), installs from it into a temporary
// GOBIN with an empty module cache (the dependencies come from the
// machine's module cache, itself a proxy's layout, so nothing is
// downloaded), and runs the installed binary's `gateway version`, which
// must say the version. It compiles every package of the module: it
// runs under `make test-release` (DEVICEGATE_RELEASE_TEST=1), not in
// make test.
func TestGoInstall(t *testing.T) {
	if os.Getenv("DEVICEGATE_RELEASE_TEST") == "" {
		t.Skip("compiles the whole module; run make test-release")
	}
	const v = "v0.99.0-installtest"
	root := filepath.Dir(filepath.Dir(sourceDir))
	proxy := t.TempDir()
	if err := writeModuleProxy(proxy, root, v, time.Now()); err != nil {
		t.Fatal(err)
	}
	goEnv := func(key string) string {
		out, err := exec.Command("go", "env", key).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", key, err)
		}
		return strings.TrimSpace(string(out))
	}
	cache := filepath.Join(goEnv("GOMODCACHE"), "cache", "download")
	gobin, modcache := t.TempDir(), t.TempDir()
	install := exec.Command("go", "install", modulePath+"/cmd/gateway@"+v)
	install.Dir = t.TempDir() // outside any module
	install.Env = append(os.Environ(),
		"GOBIN="+gobin,
		"GOMODCACHE="+modcache,
		// This version exists nowhere but here: no checksum database
		// knows it. The dependencies are checked against the module's
		// go.sum as ever.
		"GOPROXY=file://"+proxy+",file://"+cache+","+goEnv("GOPROXY"),
		"GONOSUMDB="+modulePath,
		"GOFLAGS=-modcacherw", // t.TempDir removes the module cache
		"GOWORK=off",
	)
	out, err := install.CombinedOutput()
	if err != nil {
		t.Fatalf("go install %s/cmd/gateway@%s: %v\n%s", modulePath, v, err, out)
	}
	bin := filepath.Join(gobin, "gateway")
	out, err = exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "devicegate "+v+" (") {
		t.Fatalf("%s version: %v\n%s\nwant it to start %q", bin, err, out, "devicegate "+v+" (")
	}
	t.Logf("installed %s: %s", bin, strings.TrimSpace(string(out)))
}

// writeModuleProxy writes the files git tracks under root, as they are
// in the working tree, as version v of the module into dir, laid out as
// a module proxy: PATH/@v/list, v.info, v.mod and v.zip (files under
// "PATH@v/", as the go command requires).
func writeModuleProxy(dir, root, v string, at time.Time) error {
	ls := exec.Command("git", "ls-files", "-z")
	ls.Dir = root
	list, err := ls.Output()
	if err != nil {
		return fmt.Errorf("git ls-files: %w", err)
	}
	at = at.UTC().Truncate(time.Second)
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, name := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		// A module zip holds no vendor directory and no other module.
		if strings.HasPrefix(name, "vendor/") || strings.Contains(name, "/vendor/") ||
			name != "go.mod" && filepath.Base(name) == "go.mod" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, name))
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			return err
		}
		w, err := zw.CreateHeader(&zip.FileHeader{Name: modulePath + "@" + v + "/" + name, Method: zip.Deflate, Modified: at})
		if err != nil {
			return err
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
	}
	if err := zw.Close(); err != nil {
		return err
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return err
	}
	at0 := at.Format(time.RFC3339)
	vdir := filepath.Join(dir, filepath.FromSlash(modulePath), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		"list":      []byte(v + "\n"),
		v + ".info": fmt.Appendf(nil, `{"Version":%q,"Time":%q}`, v, at0),
		v + ".mod":  mod,
		v + ".zip":  buf.Bytes(),
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
