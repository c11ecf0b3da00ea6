package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestMalformedPathAnswersJSON: a dead-letter path (or any) with an
// invalid percent-escape, which net/http refuses before any handler,
// answers 400 with the API's JSON error, on a connection of the real
// listener; a sound request on the same listener is answered as ever.
// Before, the answer was net/http's plain text "400 Bad Request".
func TestMalformedPathAnswersJSON(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	if err := e.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.srv.Close(ctx)
	})
	for _, path := range []string{"/api/v1/forward/%ZZ/dead", "/api/v1/forward/up/dead/replay%ZZ", "/api/v1/devices/%Z"} {
		c, err := net.DialTimeout("tcp", e.srv.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: gateway.example\r\nAuthorization: Bearer %s\r\n\r\n", path, testToken)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		c.Close()
		var v struct{ Error string }
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &v) != nil || !strings.Contains(v.Error, "percent-escape") {
			t.Fatalf("GET %s: %d %s %q", path, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
	resp, err := http.Get("http://" + e.srv.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz after: %d", resp.StatusCode)
	}
}
