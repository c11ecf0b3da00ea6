package main

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestStackEnv(t *testing.T) {
	for _, c := range []struct {
		name    string
		in      []string
		want    []string
		changed bool
	}{
		{"no GODEBUG", []string{"A=1"}, []string{"A=1", "GODEBUG=gcshrinkstackoff=1"}, true},
		{"empty GODEBUG", []string{"GODEBUG=", "B=2"}, []string{"GODEBUG=gcshrinkstackoff=1", "B=2"}, true},
		{"other settings kept", []string{"GODEBUG=gctrace=1"}, []string{"GODEBUG=gctrace=1,gcshrinkstackoff=1"}, true},
		{"operator's off", []string{"GODEBUG=gctrace=1,gcshrinkstackoff=0"}, []string{"GODEBUG=gctrace=1,gcshrinkstackoff=0"}, false},
		{"operator's on", []string{"GODEBUG=gcshrinkstackoff=1"}, []string{"GODEBUG=gcshrinkstackoff=1"}, false},
		{"a longer name is another setting", []string{"GODEBUG=xgcshrinkstackoff=0"}, []string{"GODEBUG=xgcshrinkstackoff=0,gcshrinkstackoff=1"}, true},
		{"GODEBUGX is another variable", []string{"GODEBUGX=gcshrinkstackoff=0"}, []string{"GODEBUGX=gcshrinkstackoff=0", "GODEBUG=gcshrinkstackoff=1"}, true},
	} {
		in := slices.Clone(c.in)
		got, changed := stackEnv(in)
		if !slices.Equal(got, c.want) || changed != c.changed {
			t.Errorf("%s: stackEnv(%q) = %q, %v; want %q, %v", c.name, c.in, got, changed, c.want, c.changed)
		}
		if !slices.Equal(in, c.in) {
			t.Errorf("%s: stackEnv changed its argument to %q", c.name, in)
		}
	}
}

func TestKeepsStacks(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--mqtt-addr", "127.0.0.1:0"}, true},
		{[]string{"serve", "--config", "x.yaml"}, true},
		{[]string{"simulate", "--devices", "10"}, true},
		{[]string{"quota", "list"}, false},
		{[]string{"check", "--config", "x.yaml"}, false},
		{[]string{"--help"}, false},
		{[]string{"--version"}, false},
		{[]string{"help", "serve"}, false},
	} {
		if got := keepsStacks(c.args); got != c.want {
			t.Errorf("keepsStacks(%q) = %v, want %v", c.args, got, c.want)
		}
	}
}

// TestServeKeepsStacksProcess: a gateway process started without the
// setting runs with GODEBUG=gcshrinkstackoff=1 in its environment, which
// the Go runtime reads at start, its other GODEBUG settings kept; one
// started with the operator's own value keeps that.
func TestServeKeepsStacksProcess(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"", "GODEBUG=gcshrinkstackoff=1"},
		{"GODEBUG=madvdontneed=1", "GODEBUG=madvdontneed=1,gcshrinkstackoff=1"},
		{"GODEBUG=gcshrinkstackoff=0", "GODEBUG=gcshrinkstackoff=0"},
	} {
		t.Run(c.env, func(t *testing.T) {
			p := startEnv(t, []string{c.env}, "serve", "--mqtt-addr", "127.0.0.1:0", "--data-dir", t.TempDir())
			p.waitLine(listeningRE, 10*time.Second)
			environ, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/environ")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, kv := range strings.Split(string(environ), "\x00") {
				if strings.HasPrefix(kv, "GODEBUG=") {
					got = append(got, kv)
				}
			}
			if len(got) != 1 || got[0] != c.want {
				t.Errorf("the serving process's GODEBUG is %q, want %q", got, c.want)
			}
			p.cmd.Process.Kill()
			p.wait(10 * time.Second)
		})
	}
}
