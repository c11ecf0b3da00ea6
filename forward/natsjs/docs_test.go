package natsjs

import (
	"context"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/devicegate/devicegate/internal/doctest"
	"github.com/devicegate/devicegate/internal/natstest"
)

// TestDocsNATSStreamBlock runs the block of docs/forwarding.md that
// creates the JetStream stream without the nats command-line tool
// (bash speaking the NATS protocol) against a real nats-server, its
// 127.0.0.1/4222 made the server's address, and checks the stream it
// made: DEVICES, subjects fleet.>, file storage, a duplicate window of
// 10 minutes. Run twice, it changes nothing, as the page says.
func TestDocsNATSStreamBlock(t *testing.T) {
	pages, err := doctest.Pages("../..")
	if err != nil {
		t.Fatal(err)
	}
	var block string
	for _, p := range pages {
		for _, b := range p.Blocks() {
			if b.Runnable == "TestDocsNATSStreamBlock" {
				block = b.Code
			}
		}
	}
	if !strings.Contains(block, "127.0.0.1/4222") {
		t.Fatalf("no runnable block for this test naming 127.0.0.1/4222 in the docs:\n%s", block)
	}
	srv := natstest.Start(t)
	host, port, _ := net.SplitHostPort(srv.Addr)
	script := strings.ReplaceAll(block, "127.0.0.1/4222", host+"/"+port)
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, "bash", "-e", "-c", script).CombinedOutput()
		cancel()
		if err != nil || !strings.Contains(string(out), `"config"`) || strings.Contains(string(out), `"error"`) {
			t.Fatalf("the block: %v\n%s", err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := srv.JetStream().Stream(ctx, "DEVICES")
	if err != nil {
		t.Fatalf("the stream the block made: %v", err)
	}
	c := st.CachedInfo().Config
	if !slices.Equal(c.Subjects, []string{"fleet.>"}) || c.Storage != jetstream.FileStorage || c.Duplicates != 10*time.Minute {
		t.Fatalf("stream config: subjects %v, storage %v, duplicate window %s; want fleet.>, file, 10m", c.Subjects, c.Storage, c.Duplicates)
	}
}
