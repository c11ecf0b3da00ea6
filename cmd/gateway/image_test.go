package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestImage runs `make image`, checks the image's configuration (non-root
// user, the data volume, the ports, the health check on /healthz, the
// command), takes the binary and the CA bundle out of it, and runs that
// binary: it serves, and its own health check passes against it. A
// container cannot be run on these machines (the sandbox refuses the
// OCI runtime's setrlimit), so the test runs the image's binary on the
// host. It needs podman and a minute: `make test-image`
// (DEVICEGATE_IMAGE_TEST=1), not make test.
func TestImage(t *testing.T) {
	if os.Getenv("DEVICEGATE_IMAGE_TEST") == "" {
		t.Skip("builds a container image with podman; run make test-image")
	}
	const v = "v9.9.9-image"
	image := "localhost/devicegate-test:" + v
	root := filepath.Dir(filepath.Dir(sourceDir))
	mk := exec.Command("make", "--no-print-directory", "image", "IMAGE="+image, "IMAGE_CTX="+t.TempDir(), "VERSION="+v)
	mk.Dir = root
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("podman", "rmi", "-f", image).Run() })

	out, err := exec.Command("podman", "image", "inspect", image).Output()
	if err != nil {
		t.Fatalf("podman image inspect: %v", err)
	}
	var inspect []struct {
		Config struct {
			User         string
			ExposedPorts map[string]struct{}
			Volumes      map[string]struct{}
			Entrypoint   []string
			Cmd          []string
		}
		Healthcheck struct{ Test []string } // podman lists it beside Config
	}
	if err := json.Unmarshal(out, &inspect); err != nil || len(inspect) != 1 {
		t.Fatalf("image inspect %s: %v", out, err)
	}
	cfg := inspect[0].Config
	hcTest := inspect[0].Healthcheck.Test
	if cfg.User == "" || strings.HasPrefix(cfg.User, "0") || cfg.User == "root" {
		t.Errorf("image runs as %q, want a non-root user", cfg.User)
	}
	if _, ok := cfg.Volumes["/data"]; !ok {
		t.Errorf("volumes %v, want /data", cfg.Volumes)
	}
	for _, p := range []string{"1883/tcp", "8883/tcp", "8083/tcp", "8080/tcp"} {
		if _, ok := cfg.ExposedPorts[p]; !ok {
			t.Errorf("ports %v lack %s", cfg.ExposedPorts, p)
		}
	}
	if len(hcTest) < 3 || hcTest[0] != "CMD" || !slices.Contains(hcTest, "health") || !slices.Equal(cfg.Entrypoint, []string{"/gateway"}) || !slices.Contains(cfg.Cmd, "/data") {
		t.Errorf("health check %v, entrypoint %v, cmd %v", hcTest, cfg.Entrypoint, cfg.Cmd)
	}

	// Out of the image: the binary and the CA bundle.
	ctr := fmt.Sprintf("devicegate-test-%d", os.Getpid())
	if out, err := exec.Command("podman", "create", "--name", ctr, image).CombinedOutput(); err != nil {
		t.Fatalf("podman create: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("podman", "rm", "-f", ctr).Run() })
	dir := t.TempDir()
	bin := filepath.Join(dir, "gateway")
	for src, dst := range map[string]string{"/gateway": bin, "/etc/ssl/certs/ca-certificates.crt": filepath.Join(dir, "ca.crt")} {
		if out, err := exec.Command("podman", "cp", ctr+":"+src, dst).CombinedOutput(); err != nil {
			t.Fatalf("podman cp %s: %v\n%s", src, err, out)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "ca.crt")); err != nil || fi.Size() < 1000 {
		t.Fatalf("CA bundle in the image: %v", err)
	}
	out, err = exec.Command(bin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "devicegate "+v+" (") {
		t.Fatalf("the image's binary says %q (%v)", out, err)
	}
	info, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil || !strings.Contains(string(info), "CGO_ENABLED=0") || !strings.Contains(string(info), "-trimpath=true") {
		t.Fatalf("the image's binary is not static and trimmed:\n%s", info)
	}
	// It serves, and the image's health check command passes against it.
	saved := binary
	binary = bin
	g := startGW(t, t.TempDir())
	binary = saved
	hc := slices.Clone(hcTest[1:]) // after CMD
	hc[0] = bin
	for i, a := range hc {
		if a == "127.0.0.1:8080" {
			hc[i] = g.admin
		}
	}
	out, err = exec.Command(hc[0], hc[1:]...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"ok"`) {
		t.Fatalf("health check %v: %v\n%s", hc, err, out)
	}
	g.stop()
	out, err = exec.Command(hc[0], hc[1:]...).CombinedOutput()
	if err == nil {
		t.Fatalf("health check passes with the gateway stopped: %s", out)
	}
}
