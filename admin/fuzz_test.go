package admin

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

func FuzzQuotaBody(f *testing.F) {
	for _, s := range []string{
		`{"limit":5,"window":"10s"}`,
		`{"limit":5,"window":"10s","policy":"defer","expires_at":"2030-01-01T00:00:00Z"}`,
		`{"limit":1e3,"window":"1m30s","policy":"disconnect"}`,
		`{"limit":0,"window":"0s"}`,
		`{"limit":"5","window":"10s"}`,
		`{"limit":5,"window":"10s"} {}`,
		`{"limit":5,"window":"10s","x":1}`,
		`{"limit":null,"window":null,"policy":null,"expires_at":null}`,
		`[`, ``, `null`, `{"limit":-1e400}`,
		`{"windows":[{"messages":10,"window":"1m"},{"bytes":5242880,"window":"24h"}],"policy":"disconnect"}`,
		`{"windows":[{"messages":10,"bytes":1,"window":"1m"}]}`, `{"windows":[]}`, `{"limit":1,"windows":[{"messages":1,"window":"1s"}]}`,
		`{"limit":5,"window":"10s","feedback":"always"}`, `{"limit":5,"window":"10s","feedback":{"below":"10%"}}`,
		`{"limit":5,"window":"10s","feedback":{"below":0}}`, `{"limit":5,"window":"10s","feedback":"sometimes"}`,
	} {
		f.Add([]byte(s), 20)
	}
	now := t0
	f.Fuzz(func(t *testing.T, body []byte, buckets int) {
		if buckets < 1 || buckets > devicelimit.MaxBuckets {
			buckets = devicelimit.DefaultBuckets
		}
		o, err := parseQuotaBody(body, buckets, now)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if err := o.Quota.Validate(buckets); err != nil {
			t.Fatalf("accepted invalid quota %v: %v", o.Quota, err)
		}
		if o.ExpiresAt != 0 && o.ExpiresAt <= now {
			t.Fatalf("accepted expiry %v <= now", o.ExpiresAt)
		}
		// What the API answers re-encodes to a body that parses to the
		// same override.
		out := overrideOut("d", o)
		again := map[string]any{"limit": out.Limit, "window": out.Window, "policy": out.Policy}
		if out.Windows != nil {
			again = map[string]any{"windows": out.Windows, "policy": out.Policy}
		}
		if out.ExpiresAt != "" {
			again["expires_at"] = out.ExpiresAt
		}
		if out.Feedback != "" {
			again["feedback"] = out.Feedback
		}
		b, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		o2, err := parseQuotaBody(b, buckets, now)
		if err != nil {
			t.Fatalf("re-encoded %s refused: %v", b, err)
		}
		if !reflect.DeepEqual(o2, o) {
			t.Fatalf("round trip %s: %+v, want %+v", b, o2, o)
		}
		if _, err := time.ParseDuration(out.Window); err != nil && out.Windows == nil {
			t.Fatal(err)
		}
	})
}

func TestQuotaBodyFeedback(t *testing.T) {
	for body, want := range map[string]devicelimit.Feedback{
		`{"limit":5,"window":"10s"}`:                            {},
		`{"limit":5,"window":"10s","feedback":"off"}`:           {Mode: devicelimit.FeedbackOff},
		`{"limit":5,"window":"10s","feedback":"always"}`:        {Mode: devicelimit.FeedbackAlways},
		`{"limit":5,"window":"10s","feedback":{"below":"10%"}}`: {Mode: devicelimit.FeedbackBelow, Below: 10},
		`{"limit":5,"window":"10s","feedback":{"below":10}}`:    {Mode: devicelimit.FeedbackBelow, Below: 10},
		`{"limit":5,"window":"10s","feedback":"below 10%"}`:     {Mode: devicelimit.FeedbackBelow, Below: 10},
	} {
		o, err := parseQuotaBody([]byte(body), 20, t0)
		if err != nil || o.Quota.Feedback != want {
			t.Errorf("%s: %v %v, want %v", body, o.Quota.Feedback, err, want)
		}
	}
	o, err := parseQuotaBody([]byte(`{"limit":5,"window":"10s","feedback":"refusals","classes":[
		{"name":"a","topics":["a/#"],"quota":{"limit":1,"window":"1s"}},
		{"name":"b","topics":["b/#"],"quota":{"limit":1,"window":"1s","feedback":"off"}}]}`), 20, t0)
	if err != nil || o.Classes[0].Quota.Feedback.Mode != devicelimit.FeedbackRefusals || o.Classes[1].Quota.Feedback.Mode != devicelimit.FeedbackOff {
		t.Fatalf("classes: %+v %v", o.Classes, err)
	}
	for _, body := range []string{
		`{"limit":5,"window":"10s","feedback":"sometimes"}`,
		`{"limit":5,"window":"10s","feedback":{"below":"0%"}}`,
		`{"limit":5,"window":"10s","feedback":{"below":"10%","x":1}}`,
		`{"limit":5,"window":"10s","feedback":7}`,
	} {
		if _, err := parseQuotaBody([]byte(body), 20, t0); err == nil || !strings.HasPrefix(err.Error(), "feedback: must be") {
			t.Errorf("%s: %v, want an error naming feedback", body, err)
		}
	}
}
