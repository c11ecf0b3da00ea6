package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/devicegate/devicegate/internal/doctest"
)

// TestDocsRunnableBlocks runs every sh block of README.md and docs/*.md
// marked "<!-- runnable -->", as a reader would paste it, with bash -e
// (so that any failing command fails the test) in a copy of the
// checkout, one after the other. A block marked "<!-- runnable: TestX
// -->" is run by the test TestX in a way of its own (the README's Try
// it compares its output; the NATS stream block needs a nats-server;
// the device examples in JavaScript, Python and Go): that test must
// exist. The blocks use the gateway's default ports, so
// the test fails if something else holds them.
func TestDocsRunnableBlocks(t *testing.T) {
	root := filepath.Join(sourceDir, "..", "..")
	pages, err := doctest.Pages(root)
	if err != nil {
		t.Fatal(err)
	}
	tests := testFuncs(t, root)
	var run int
	for _, p := range pages {
		for _, b := range p.Blocks() {
			switch {
			case b.Runnable == "":
				continue
			case b.Runnable != "-": // in any language: TestX knows how to run it
				if !tests[b.Runnable] {
					t.Errorf("%s:%d: the block is run by %s, which is no test of the repository", p.Path, b.Line, b.Runnable)
				}
			case b.Lang != "sh":
				t.Errorf("%s:%d: a runnable block must be sh (got %q)", p.Path, b.Line, b.Lang)
			default:
				run++
				runBlock(t, root, p.Path, b)
			}
		}
	}
	if run == 0 {
		t.Fatal("no runnable block found; docs/getting-started.md has one")
	}
}

// runBlock runs one block in a fresh copy of the checkout.
func runBlock(t *testing.T, root, page string, b doctest.Block) {
	t.Helper()
	needDefaultPorts(t, fmt.Sprintf("%s:%d", page, b.Line))
	checkout := copyCheckout(t, root)
	if out, err := runPasted(checkout, b.Code, "-e"); err != nil {
		gwlog, _ := os.ReadFile(filepath.Join(checkout, "gateway.log"))
		t.Errorf("%s:%d: the runnable block failed: %v\nblock:\n%s\noutput:\n%s\ngateway.log:\n%s", page, b.Line, err, b.Code, out.String(), gwlog)
	}
}

// testFuncs returns the names of the Test functions of the repository's
// test files.
func testFuncs(t *testing.T, root string) map[string]bool {
	t.Helper()
	names := make(map[string]bool)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if name, ok := strings.CutPrefix(line, "func Test"); ok {
				name, _, _ = strings.Cut(name, "(")
				names["Test"+name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}
