package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// A baseline is another build of the gateway run beside this one in the
// same rounds (-baseline), so that a regression shows as a ratio taken
// under the same load, not as a number from another day. It is a git
// revision of this repository (built from `git archive` of it, with the
// go command and module proxy of this run) or the path of a gateway
// binary.

// baselineBin is the baseline gateway's binary in dir.
func baselineBin(dir string) string { return dir + "/gateway-baseline" }

// buildBaseline makes baselineBin(dir) of rev: a copy of the executable
// file rev names, or the gateway built from the commit rev names. It
// returns the label the tables give it (the short commit, or the file's
// base name).
func buildBaseline(dir, rev string, pprof bool) (string, error) {
	if st, err := os.Stat(rev); err == nil && st.Mode().IsRegular() {
		if st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("-baseline %q: a file, but not executable", rev)
		}
		b, err := os.ReadFile(rev)
		if err != nil {
			return "", err
		}
		return filepath.Base(rev), os.WriteFile(baselineBin(dir), b, 0o755)
	}
	out, err := exec.Command("git", "rev-parse", "--verify", "--short", rev+"^{commit}").Output()
	if err != nil {
		return "", fmt.Errorf("-baseline %q: neither an executable file nor a commit of this repository (git rev-parse: %v)", rev, err)
	}
	short := strings.TrimSpace(string(out))
	src := dir + "/baseline-src"
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	archive := exec.Command("git", "archive", "--format=tar", short)
	var tarball bytes.Buffer
	archive.Stdout = &tarball
	if err := archive.Run(); err != nil {
		return "", fmt.Errorf("git archive %s: %w", short, err)
	}
	untar := exec.Command("tar", "-x", "-C", src)
	untar.Stdin = &tarball
	if out, err := untar.CombinedOutput(); err != nil {
		return "", fmt.Errorf("untar %s: %w\n%s", short, err, out)
	}
	args, err := gatewayBuildArgs(dir, src, baselineBin(dir), pprof)
	if err != nil {
		return "", err
	}
	cmd := exec.Command(goCommand(), args...)
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build baseline %s: go %s: %w\n%s", short, strings.Join(args, " "), err, out)
	}
	return short, nil
}

// goCommand is $GO, or go.
func goCommand() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	return "go"
}

// gatewayBuildArgs are the arguments of `go build` making the gateway of
// the source tree root into out; with pprof, the gateway also serves
// net/http/pprof (bench/harness/pprof of this tree, overlaid).
func gatewayBuildArgs(dir, root, out string, pprof bool) ([]string, error) {
	args := []string{"build", "-o", out}
	if pprof {
		src, err := filepath.Abs("bench/harness/pprof/pprof.go")
		if err != nil {
			return nil, err
		}
		dst, err := filepath.Abs(filepath.Join(root, "cmd/gateway/zz_benchpprof.go"))
		if err != nil {
			return nil, err
		}
		overlay := out + ".overlay.json"
		b := fmt.Appendf(nil, `{"Replace":{%q:%q}}`, dst, src)
		if err := os.WriteFile(overlay, b, 0o644); err != nil {
			return nil, err
		}
		args = append(args, "-tags", "benchpprof", "-overlay", overlay)
	}
	return append(args, "./cmd/gateway"), nil
}
