package main

import (
	"os"
	"strings"
)

// Goroutine stacks that only grow.
//
// A device's connection reads its packets on one goroutine, and a
// publish runs the whole hook chain on it: mochi's frames from
// attachClient down to Hooks.OnPublish take about 14 KB before the
// gateway's decision adds its own, so the goroutine's stack grows from
// 16 KB to 32 KB at the device's first publish. Parked between
// publishes it uses under 8 KB, a quarter of that, so every garbage
// collection copied it back to 16 KB while scanning it, and the device's
// next publish copied it up again onto fresh memory. On a 2-core
// machine with 10,000 devices publishing every 5 s, those copies were
// most of the collector's work during a connection ramp (a CPU profile:
// 1.1 s of 1.25 s in markroot was shrinkstack), collections marked for
// 0.7-1.1 s, and the publishes they drafted into mark assist waited up
// to half a second (docs/benchmarks.md, "Goroutine stacks").
//
// The Go runtime's GODEBUG setting gcshrinkstackoff=1 keeps stacks at
// the size they grew to. It is read once, when the process starts, and
// cannot be named in a //go:debug directive, so serve and simulate set
// it by executing the gateway again with it in the environment (the
// same process: the PID, arguments, open standard streams and the rest
// of the environment are kept). An operator who names gcshrinkstackoff
// in GODEBUG, with any value, gets exactly that instead.

// stackSetting is the GODEBUG setting the long-running commands add.
const stackSetting = "gcshrinkstackoff=1"

// keepsStacks reports whether the command named by args (run's
// arguments) runs with goroutine stacks that only grow: serve, the
// default command, and simulate, whose fleet and embedded gateway are
// the same connections from both ends.
func keepsStacks(args []string) bool {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return !wantsHelp(args) && !(len(args) == 1 && (args[0] == "--version" || args[0] == "-version"))
	}
	return args[0] == "serve" || args[0] == "simulate"
}

// stackEnv returns environ with stackSetting added to GODEBUG, and
// whether it changed anything: not when GODEBUG already names
// gcshrinkstackoff.
func stackEnv(environ []string) ([]string, bool) {
	const key = "GODEBUG="
	for i, kv := range environ {
		value, ok := strings.CutPrefix(kv, key)
		if !ok {
			continue
		}
		for _, field := range strings.Split(value, ",") {
			if name, _, _ := strings.Cut(field, "="); name == "gcshrinkstackoff" {
				return environ, false
			}
		}
		out := append([]string(nil), environ...)
		if value == "" {
			out[i] = key + stackSetting
		} else {
			out[i] = kv + "," + stackSetting
		}
		return out, true
	}
	return append(append([]string(nil), environ...), key+stackSetting), true
}

// keepStacks executes the gateway again with stackSetting when args'
// command is one that keepsStacks and the environment lacks it. It
// returns only if it did not: the setting is there, the command does
// not want it, or the exec failed, which it reports on stderr (the
// gateway then runs as it would have before, with shrinking stacks).
func keepStacks(args []string) {
	if !keepsStacks(args) {
		return
	}
	env, changed := stackEnv(os.Environ())
	if !changed {
		return
	}
	if err := execSelf(env); err != nil {
		os.Stderr.WriteString("gateway: could not restart itself with GODEBUG=" + stackSetting +
			" (goroutine stacks will shrink at each collection; docs/benchmarks.md): " + err.Error() + "\n")
	}
}
