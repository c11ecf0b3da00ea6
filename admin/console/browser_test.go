package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// ShotsEnv names a directory the browser tests write their screenshots
// (and the overview's page text) to, kept after the test (never commit
// the screenshots); unset, they go to the test's temporary directory
// and are deleted with it.
const ShotsEnv = "DEVICEGATE_CONSOLE_SHOTS"

// browser is a headless Chromium driving one tab, with what the tab
// requested and received.
type browser struct {
	t     *testing.T
	ctx   context.Context
	shots string

	mu       sync.Mutex
	all      []string           // every request's URL since the start
	urls     []string           // those since resetRequests
	received map[string]float64 // bytes over the wire by request ID, since resetRequests
	dialogs  []string           // JavaScript dialogs opened (alert...)
	problems []string           // uncaught errors, console errors, failed requests
}

// startBrowser runs Debian's chromium with a fresh profile. A missing
// chromium fails the test: scripts/ensure-tools.sh installs it.
func startBrowser(t *testing.T) *browser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (%v): run scripts/ensure-tools.sh, which installs Debian's chromium package", err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	for _, f := range []string{"headless", "no-sandbox", "disable-gpu", "disable-quic", "no-first-run",
		"disable-background-networking", "disable-component-update", "disable-sync"} {
		opts = append(opts, chromedp.Flag(f, true))
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	b := &browser{t: t, received: map[string]float64{}}
	b.shots = os.Getenv(ShotsEnv)
	if b.shots == "" {
		b.shots = t.TempDir()
	} else if err := os.MkdirAll(b.shots, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithListener(b.listen))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, log.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("chromium's log: %v", err)
	}
	b.ctx = ctx
	return b
}

// listen records requests, bytes received and dialogs; it runs in the
// tab's read loop, so it only records.
func (b *browser) listen(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		b.urls = append(b.urls, ev.Request.URL)
		b.all = append(b.all, ev.Request.URL)
	case *network.EventLoadingFinished:
		b.received[string(ev.RequestID)] += ev.EncodedDataLength
	case *page.EventJavascriptDialogOpening:
		b.dialogs = append(b.dialogs, ev.Message)
	case *runtime.EventExceptionThrown:
		msg := ev.ExceptionDetails.Text
		if ev.ExceptionDetails.Exception != nil {
			msg += " " + ev.ExceptionDetails.Exception.Description
		}
		b.problems = append(b.problems, "uncaught: "+msg)
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			var args []string
			for _, a := range ev.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			b.problems = append(b.problems, "console."+string(ev.Type)+": "+strings.Join(args, " "))
		}
	case *network.EventLoadingFailed:
		b.problems = append(b.problems, "request failed: "+ev.ErrorText+" ("+string(ev.RequestID)+")")
	case *network.EventResponseReceived:
		if ev.Response.Status >= 400 {
			b.problems = append(b.problems, fmt.Sprintf("%d from %s", ev.Response.Status, ev.Response.URL))
		}
	case *log.EventEntryAdded:
		if ev.Entry.Level == log.EntryLevelError {
			b.problems = append(b.problems, "log: "+ev.Entry.Text+" "+ev.Entry.URL)
		}
	}
}

// do runs actions, each within 20 s.
func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval returns a JavaScript expression's value.
func eval[T any](b *browser, js string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// click clicks the element of a CSS selector where the page has it now,
// in one step in the page: chromedp.Click finds the node first, and a
// refresh replacing the section in between ("Could not find node with
// given id") fails it.
func (b *browser) click(what, selector string) {
	b.t.Helper()
	if !eval[bool](b, `(e => e ? (e.click(), true) : false)(document.querySelector(`+js(selector)+`))`) {
		b.t.Fatalf("%s: nothing matches %s", what, selector)
	}
}

// waitFor waits until a JavaScript expression is true, failing the test
// after 20 s with what it waited for and the page's text. It asks again
// after an error: a navigation may have replaced the page's context.
func (b *browser) waitFor(what, js string) {
	b.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+js+")"))
		cancel()
		if err == nil && ok {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond) // polling the page, not waiting for time to pass
	}
	text, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerText`))
	b.t.Fatalf("waiting for %s (%s): not true in 20 s (last error: %v)\npage:\n%s", what, js, last, text)
}

// shot saves a screenshot of the whole page as name.png.
func (b *browser) shot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(b.shots, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot %s", path)
}

// text saves the page's text (what a reader sees, document.body's
// innerText) as name.txt beside the screenshots.
func (b *browser) text(name string) {
	b.t.Helper()
	txt := eval[string](b, `document.body.innerText`)
	path := filepath.Join(b.shots, name+".txt")
	if err := os.WriteFile(path, []byte(txt), 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("page text %s", path)
}

// requests returns the URLs requested so far and the bytes received.
func (b *browser) requests() ([]string, float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n float64
	for _, v := range b.received {
		n += v
	}
	return append([]string(nil), b.urls...), n
}

func (b *browser) resetRequests() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.urls, b.received = nil, map[string]float64{}
}

// allRequests returns every URL the tab requested.
func (b *browser) allRequests() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.all...)
}

// takeProblems returns the uncaught errors, console errors and failed
// requests since the last call.
func (b *browser) takeProblems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.problems
	b.problems = nil
	return p
}

func (b *browser) openDialogs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.dialogs...)
}

// js quotes s as a JavaScript string.
func js(s string) string {
	return fmt.Sprintf("%q", s) // Go's quoting is valid JavaScript for the strings used here
}
