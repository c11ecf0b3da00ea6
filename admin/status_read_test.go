package admin

import (
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// TestStatusGetChangesNothing: a device-status GET of a disconnected
// device whose quota has a window length other than its window's (an
// override set since), seconds later, reads the window and leaves its
// bytes as they were; it used to re-cut the window to the new length.
func TestStatusGetChangesNothing(t *testing.T) {
	e := newEnv(t, devicelimit.IdentityClientID)
	q := devicelimit.Quota{Limit: 100, Window: 10 * time.Second} // the default
	for i := range 5 {
		e.table.AllowAt("meter-1", q, t0.Add(time.Duration(i)*time.Second))
	}
	if r := e.do("PUT", devPath("meter-1", "/quota"), `{"limit":100,"window":"1m"}`, nil); r.status != http.StatusOK {
		t.Fatalf("PUT quota: %d %s", r.status, r.body)
	}
	before, _ := e.table.Snapshot("meter-1")
	e.clock.Set(t0.Add(12 * time.Second))
	r := e.do("GET", devPath("meter-1", ""), "", nil)
	if r.status != http.StatusOK {
		t.Fatalf("GET: %d %s", r.status, r.body)
	}
	if after, _ := e.table.Snapshot("meter-1"); !reflect.DeepEqual(after, before) {
		t.Fatalf("a GET changed the window:\nbefore %+v\nafter  %+v\nGET said %s", before, after, r.body)
	}
}
