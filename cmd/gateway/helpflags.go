package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// printFlags lists fs's flags, one per entry with its usage below: the
// format of every command's and subcommand's help.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		if name != "" {
			name = " " + name
		}
		fmt.Fprintf(w, "  --%s%s\n    \t%s\n", f.Name, name, usage)
	})
}

// wantsHelp reports whether args ask for help (-h, -help, --help)
// before any "--".
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// subcommandHelp prints the usage lines of usage that show subcommand
// sub of cmd ("  gateway CMD SUB ..."), or all of usage when none does,
// and then fs's flags; it returns flag.ErrHelp (exit 0). Every
// subcommand of quota and forward answers --help through it, so one
// added later does too.
func subcommandHelp(w io.Writer, cmd, sub, usage string, fs *flag.FlagSet) error {
	prefix := "  gateway " + cmd + " " + sub
	var lines []string
	for _, l := range strings.Split(usage, "\n") {
		if l == prefix || strings.HasPrefix(l, prefix+" ") {
			lines = append(lines, strings.TrimPrefix(l, "  "))
		}
	}
	if len(lines) == 0 {
		fmt.Fprint(w, usage)
	} else {
		fmt.Fprintf(w, "Usage: %s\n\nRun \"gateway help %s\" for what every %s subcommand does.\n", strings.Join(lines, "\n       "), cmd, cmd)
	}
	fmt.Fprintln(w, "\nFlags:")
	printFlags(w, fs)
	return flag.ErrHelp
}
