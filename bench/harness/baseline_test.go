package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBaselineRefusesWhatItCannotBuild: a -baseline that is neither a
// commit nor an executable file is refused with an error naming it,
// before anything is started.
func TestBaselineRefusesWhatItCannotBuild(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "not-a-binary")
	if err := os.WriteFile(plain, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for rev, want := range map[string]string{
		"no-such-revision-0123": `-baseline "no-such-revision-0123": neither an executable file nor a commit`,
		plain:                   "a file, but not executable",
	} {
		_, err := buildBaseline(dir, rev, false)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("buildBaseline(%q): got %v, want an error containing %q", rev, err, want)
		}
		if _, err := os.Stat(baselineBin(dir)); !os.IsNotExist(err) {
			t.Errorf("buildBaseline(%q) left %s behind (%v)", rev, baselineBin(dir), err)
		}
	}
}

// TestBaselineBinaryCopied: the path of an executable is the baseline
// as it is, labelled by its name.
func TestBaselineBinaryCopied(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(t.TempDir(), "gateway-v1")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	label, err := buildBaseline(dir, bin, false)
	if err != nil || label != "gateway-v1" {
		t.Fatalf("got %q, %v; want gateway-v1, nil", label, err)
	}
	b, err := os.ReadFile(baselineBin(dir))
	if err != nil || string(b) != "#!/bin/sh\n" {
		t.Fatalf("baseline binary: %q, %v", b, err)
	}
}

// TestBesideBaseline: each forwarding setup of the baseline runs right
// after the same setup of this build; the setups without a forwarder
// keep their places.
func TestBesideBaseline(t *testing.T) {
	fw := &forwardingGateway{}
	var targets, base []forwardTarget
	for _, name := range []string{setupPlain, setupForward, setupBridge, "gateway -> redis streams"} {
		tg := forwardTarget{name: name}
		if strings.Contains(name, "->") && name != setupBridge {
			tg.fwd = fw
			base = append(base, forwardTarget{name: baselineName(name, "abc1234"), fwd: fw})
		}
		targets = append(targets, tg)
	}
	var got []string
	for _, tg := range besideBaseline(targets, base, "abc1234") {
		got = append(got, tg.name)
	}
	want := []string{setupPlain, setupForward, "gateway @abc1234 -> mosquitto", setupBridge, "gateway -> redis streams", "gateway @abc1234 -> redis streams"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("order %q, want %q", got, want)
	}
}
