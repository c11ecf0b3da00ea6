package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// maxBody bounds the request body of PUT /api/v1/devices/{id}/quota.
const maxBody = 64 << 10

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	return io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
}

// maxField bounds each field of a quota body, so error messages that
// quote a bad value stay short.
const maxField = 64

// quotaBody is the JSON body of PUT /api/v1/devices/{id}/quota.
type quotaBody struct {
	quotaPart
	ExpiresAt *string     `json:"expires_at,omitempty"` // RFC 3339, in the future
	Classes   []classBody `json:"classes,omitempty"`
}

// quotaPart is a quota in a body: the override's, or a class's.
type quotaPart struct {
	Limit   json.RawMessage `json:"limit"`
	Window  *string         `json:"window"`
	Windows []windowBody    `json:"windows,omitempty"` // instead of limit and window
	Policy  *string         `json:"policy,omitempty"`  // default drop
	Enforce *bool           `json:"enforce,omitempty"` // false: shadow mode
	Block   *blockBody      `json:"block,omitempty"`   // automatic blocking
	// Feedback is "off", "refusals", "always" or {"below": "25%"};
	// absent: the default (a class: the override's).
	Feedback json.RawMessage `json:"feedback,omitempty"`
}

// parseFeedback reads a quota body's feedback.
func parseFeedback(raw json.RawMessage) (devicelimit.Feedback, error) {
	bad := fmt.Errorf(`feedback: must be "off", "refusals", "always" or {"below": "N%%"} with N from 1 to 100 (got %s)`, clipField(string(raw)))
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		f, err := devicelimit.ParseFeedback(mode) // "below 25%" too, as answers write it
		if err != nil {
			return f, bad
		}
		return f, nil
	}
	var below struct {
		Below json.RawMessage `json:"below"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if dec.Decode(&below) != nil || below.Below == nil {
		return devicelimit.Feedback{}, bad
	}
	share := string(below.Below)
	if json.Unmarshal(below.Below, &mode) == nil {
		share = mode
	}
	f, err := devicelimit.ParseFeedbackBelow(share)
	if err != nil {
		return f, bad
	}
	return f, nil
}

// blockBody is automatic blocking in a quota body.
type blockBody struct {
	After  int    `json:"after"`
	Within string `json:"within"`
	For    string `json:"for"`
}

// classBody is a topic class of an override.
type classBody struct {
	Name   *string    `json:"name"`
	Topics []string   `json:"topics"`
	Quota  *quotaPart `json:"quota"`
}

// Bounds on an override's classes, so that one request stays small.
const (
	maxClasses     = 32
	maxClassTopics = 16
)

// windowBody is one window of a quota of several: messages or bytes.
type windowBody struct {
	Messages json.RawMessage `json:"messages,omitempty"`
	Bytes    json.RawMessage `json:"bytes,omitempty"`
	Window   *string         `json:"window"`
}

// parseWindows reads the windows of a quota body; the errors name the
// window and field.
func parseWindows(ws []windowBody) ([]devicelimit.Limit, error) {
	if len(ws) > devicelimit.MaxWindows {
		return nil, fmt.Errorf("windows: must hold 1 to %d windows (got %d)", devicelimit.MaxWindows, len(ws))
	}
	ls := make([]devicelimit.Limit, len(ws))
	for i, w := range ws {
		key := fmt.Sprintf("windows[%d]", i)
		hasM, hasB := len(w.Messages) > 0 && string(w.Messages) != "null", len(w.Bytes) > 0 && string(w.Bytes) != "null"
		if hasM == hasB {
			return nil, fmt.Errorf("%s: give messages or bytes, one of them", key)
		}
		raw, field, top := w.Messages, "messages", devicelimit.MaxLimit
		if hasB {
			raw, field, top, ls[i].Unit = w.Bytes, "bytes", devicelimit.MaxBytes, devicelimit.Bytes
		}
		if len(raw) > maxField {
			return nil, fmt.Errorf("%s.%s: longer than %d bytes", key, field, maxField)
		}
		n, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil || n < 1 || n > int64(top) {
			return nil, fmt.Errorf("%s.%s: must be an integer between 1 and %d (got %s)", key, field, top, raw)
		}
		ls[i].N = int(n)
		if w.Window == nil || len(*w.Window) > maxField {
			return nil, fmt.Errorf("%s.window: required, a duration such as \"1m\" of at most %d bytes", key, maxField)
		}
		if ls[i].Window, err = time.ParseDuration(*w.Window); err != nil {
			return nil, fmt.Errorf("%s.window: not a duration such as \"1m\" (got %q)", key, *w.Window)
		}
	}
	return ls, nil
}

// parseQuotaBody decodes and validates a quota body for a table of the
// given bucket count at now. Unknown fields, trailing data, a missing
// limit or window, and any value Quota.Validate refuses are errors that
// name the field and the value.
func parseQuotaBody(body []byte, buckets int, now devicelimit.Tick) (devicelimit.Override, error) {
	var b quotaBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		if errors.Is(err, io.EOF) {
			return devicelimit.Override{}, errors.New("empty body: send {\"limit\":N,\"window\":\"10s\"}")
		}
		return devicelimit.Override{}, fmt.Errorf("bad JSON body: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return devicelimit.Override{}, errors.New("bad JSON body: data after the object")
	}
	if b.ExpiresAt != nil && len(*b.ExpiresAt) > maxField {
		return devicelimit.Override{}, fmt.Errorf("expires_at: longer than %d bytes", maxField)
	}
	q, err := b.quotaPart.quota("", buckets)
	if err != nil {
		return devicelimit.Override{}, err
	}
	o := devicelimit.Override{Quota: q}
	if o.Classes, err = parseClasses(b.Classes, buckets); err != nil {
		return devicelimit.Override{}, err
	}
	for i := range o.Classes {
		if o.Classes[i].Quota.Feedback == (devicelimit.Feedback{}) {
			o.Classes[i].Quota.Feedback = q.Feedback // a class's is the override's unless it says
		}
	}
	if b.ExpiresAt != nil {
		t, err := time.Parse(time.RFC3339Nano, *b.ExpiresAt)
		if err != nil {
			return devicelimit.Override{}, fmt.Errorf("expires_at: not an RFC 3339 time such as \"2030-01-02T15:04:05Z\" (got %q)", *b.ExpiresAt)
		}
		// Ticks are int64 nanoseconds: years 1678..2262.
		if t.Year() < 1971 || t.Year() > 2261 {
			return devicelimit.Override{}, fmt.Errorf("expires_at: out of range (got %q)", *b.ExpiresAt)
		}
		o.ExpiresAt = devicelimit.TickOf(t)
		if o.ExpiresAt <= now {
			return devicelimit.Override{}, fmt.Errorf("expires_at: must be in the future (got %q, now %s)", *b.ExpiresAt, formatTick(now))
		}
	}
	if err := devicelimit.ValidateClasses(o.Classes, buckets); err != nil {
		return devicelimit.Override{}, err // the classes as a whole: names, filters
	}
	return o, nil
}

// quota reads a quota of a body; prefix starts the names of the fields
// in errors ("classes[0].quota.").
func (b quotaPart) quota(prefix string, buckets int) (devicelimit.Quota, error) {
	bad := func(format string, args ...any) (devicelimit.Quota, error) {
		return devicelimit.Quota{}, fmt.Errorf(prefix+format, args...)
	}
	for _, f := range []struct {
		name string
		v    *string
	}{{"window", b.Window}, {"policy", b.Policy}} {
		if f.v != nil && len(*f.v) > maxField {
			return bad("%s: longer than %d bytes", f.name, maxField)
		}
	}
	if len(b.Limit) > maxField {
		return bad("limit: longer than %d bytes", maxField)
	}
	var q devicelimit.Quota
	var err error
	if b.Windows != nil {
		if len(b.Limit) > 0 || b.Window != nil {
			return bad("windows: give limit and window, or windows, not both")
		}
		ls, err := parseWindows(b.Windows)
		if err != nil {
			return bad("%v", err)
		}
		if len(ls) == 0 {
			return bad("windows: must hold 1 to %d windows (got 0)", devicelimit.MaxWindows)
		}
		q = devicelimit.WithWindows(0, ls...)
	} else {
		if len(b.Limit) == 0 || string(b.Limit) == "null" {
			return bad("limit: required")
		}
		if q.Limit, err = parseLimit(string(b.Limit)); err != nil {
			return bad("%v", err)
		}
		if b.Window == nil {
			return bad("window: required, a duration such as \"10s\"")
		}
		if q.Window, err = time.ParseDuration(*b.Window); err != nil {
			return bad("window: not a duration such as \"10s\" (got %q)", *b.Window)
		}
	}
	if b.Policy != nil {
		if q.Policy, err = devicelimit.ParsePolicy(*b.Policy); err != nil {
			return bad("policy: %v", err)
		}
	}
	q.Shadow = b.Enforce != nil && !*b.Enforce
	if len(b.Feedback) > 0 && string(b.Feedback) != "null" {
		if q.Feedback, err = parseFeedback(b.Feedback); err != nil {
			return bad("%v", err)
		}
	}
	if b.Block != nil {
		within, err1 := time.ParseDuration(b.Block.Within)
		dur, err2 := time.ParseDuration(b.Block.For)
		switch {
		case err1 != nil || len(b.Block.Within) > maxField:
			return bad("block.within: not a duration such as \"1m\" (got %q)", clipField(b.Block.Within))
		case err2 != nil || len(b.Block.For) > maxField:
			return bad("block.for: not a duration such as \"10m\" (got %q)", clipField(b.Block.For))
		}
		q.Block = devicelimit.Block{After: b.Block.After, Within: within, For: dur}
	}
	if err := q.Validate(buckets); err != nil {
		return bad("%v", err)
	}
	return q, nil
}

// clipField shortens a field quoted in an error.
func clipField(s string) string {
	if len(s) > maxField {
		return s[:maxField] + "..."
	}
	return s
}

// parseClasses reads an override's topic classes; the errors name the
// class and field ("classes[1].topics[0]: ...").
func parseClasses(cs []classBody, buckets int) ([]devicelimit.Class, error) {
	if len(cs) > maxClasses {
		return nil, fmt.Errorf("classes: at most %d (got %d)", maxClasses, len(cs))
	}
	var out []devicelimit.Class
	for i, c := range cs {
		key := fmt.Sprintf("classes[%d]", i)
		if c.Name == nil {
			return nil, fmt.Errorf("%s.name: required", key)
		}
		if len(c.Topics) > maxClassTopics {
			return nil, fmt.Errorf("%s.topics: at most %d filters (got %d)", key, maxClassTopics, len(c.Topics))
		}
		if c.Quota == nil {
			return nil, fmt.Errorf("%s.quota: required, a quota of the class's own", key)
		}
		q, err := c.Quota.quota(key+".quota.", buckets)
		if err != nil {
			return nil, err
		}
		out = append(out, devicelimit.Class{Name: *c.Name, Topics: c.Topics, Quota: q})
	}
	return out, nil
}

// parseLimit accepts an integral JSON number (1000, 1e3, 1000.0) within
// 1..MaxLimit; not a string or another JSON type.
func parseLimit(s string) (int, error) {
	if s[0] != '-' && (s[0] < '0' || s[0] > '9') {
		return 0, fmt.Errorf("%w: limit must be a JSON number (got %s)", devicelimit.ErrInvalidQuota, s)
	}
	bad := fmt.Errorf("%w: limit must be an integer between 1 and %d (got %s)", devicelimit.ErrInvalidQuota, devicelimit.MaxLimit, s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 1 || n > devicelimit.MaxLimit {
			return 0, bad
		}
		return int(n), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || f < 1 || f > devicelimit.MaxLimit {
		return 0, bad
	}
	return int(f), nil
}

// refuseDefer is the error of an override with policy defer, its own or
// a class's, when the gateway cannot defer (Options.NoDefer); nil
// otherwise.
func (s *Server) refuseDefer(o devicelimit.Override) error {
	if s.opts.NoDefer == "" {
		return nil
	}
	if o.Quota.Policy == devicelimit.PolicyDefer {
		return fmt.Errorf("policy: %s; nothing was set", s.opts.NoDefer)
	}
	for i, c := range o.Classes {
		if c.Quota.Policy == devicelimit.PolicyDefer {
			return fmt.Errorf("classes[%d].quota.policy: %s; nothing was set", i, s.opts.NoDefer)
		}
	}
	return nil
}
