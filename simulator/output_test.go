package simulator

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestProgressLine(t *testing.T) {
	var b strings.Builder
	p := ProgressLine(&b)
	p(Progress{Elapsed: time.Second, Connected: 10, Sent: 100, Refused: 20, Over: 0})
	p(Progress{Elapsed: 3 * time.Second, Connected: 9, Sent: 300, Refused: 60, Over: 2})
	want := "\r\033[K    1s  connected 10  sent/s 100  refused/s 20  over quota 0" +
		"\r\033[K    3s  connected 9  sent/s 100  refused/s 20  over quota 2"
	if b.String() != want {
		t.Fatalf("got %q\nwant %q", b.String(), want)
	}
}

// TestLostHint: lost messages in a run against a gateway the simulator
// did not start come with the likely cause and the fix; not when
// nothing was lost, when the gateway is the simulator's own, or when the
// subscriber's connection ended (then lost counts are not to be
// trusted).
func TestLostHint(t *testing.T) {
	rep := &Report{}
	rep.Result.Totals.Lost = 76
	if h := rep.LostHint(true); !strings.HasPrefix(h, "76 acknowledged messages never reached the subscriber") || !strings.Contains(h, `mqtt.consumers: {client_ids: ["simulator-sub-*"]}`) {
		t.Fatalf("hint %q", h)
	}
	if h := rep.LostHint(false); h != "" {
		t.Fatalf("an own gateway: %q", h)
	}
	rep.SubscriberLost = true
	if h := rep.LostHint(true); h != "" {
		t.Fatalf("subscriber lost: %q", h)
	}
	if h := (&Report{}).LostHint(true); h != "" {
		t.Fatalf("nothing lost: %q", h)
	}
}

// TestSaveReports: the JSON report goes to a file or to stdout ("-")
// and reads back; a file that cannot be created is an error, for both
// reports.
func TestSaveReports(t *testing.T) {
	rep := &Report{}
	rep.Result.Totals.Lost = 3
	var out strings.Builder
	if err := rep.SaveJSON("-", &out); err != nil || !strings.HasSuffix(out.String(), "}\n") {
		t.Fatalf("to stdout: %v %q", err, out.String())
	}
	name := filepath.Join(t.TempDir(), "r.json")
	if err := rep.SaveJSON(name, nil); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(name)
	if err != nil || string(b) != out.String() {
		t.Fatalf("file holds %q (%v), want what stdout got", b, err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil || back.Result.Totals.Lost != 3 {
		t.Fatalf("read back: %+v %v", back.Result.Totals, err)
	}
	missing := filepath.Join(t.TempDir(), "no", "such", "dir", "r")
	if err := rep.SaveJSON(missing, nil); err == nil {
		t.Error("SaveJSON into a missing directory: no error")
	}
	if err := rep.SaveHTML(missing); err == nil {
		t.Error("SaveHTML into a missing directory: no error")
	}
}
