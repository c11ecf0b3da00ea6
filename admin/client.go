package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Client calls a gateway's admin API: `gateway quota` and the simulator
// (its quota mix on a running or spawned gateway) use it. Each call
// returns the answer decoded into the API's own types, and the raw JSON
// for those that print it as it came.
type Client struct {
	// Addr is the API's host:port; Token its bearer token.
	Addr, Token string
	// HTTP makes the requests; it should have a timeout.
	HTTP *http.Client
}

// APIError is an answer other than 2xx: the status and the API's
// message.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status) }

// TransportError is a request that got no answer: the gateway is down,
// the address is wrong, or the answer could not be read.
type TransportError struct{ Err error }

func (e *TransportError) Error() string { return e.Err.Error() }
func (e *TransportError) Unwrap() error { return e.Err }

func devicePath(id, suffix string) string { return "/api/v1/devices/" + url.PathEscape(id) + suffix }

// Device answers GET /api/v1/devices/{id}.
func (c *Client) Device(ctx context.Context, id string) (DeviceJSON, []byte, error) {
	var v DeviceJSON
	raw, err := c.call(ctx, http.MethodGet, devicePath(id, ""), nil, &v)
	return v, raw, err
}

// SetQuota sets the device's override (PUT /api/v1/devices/{id}/quota).
func (c *Client) SetQuota(ctx context.Context, id string, q SetQuotaJSON) (OverrideJSON, []byte, error) {
	var v OverrideJSON
	raw, err := c.call(ctx, http.MethodPut, devicePath(id, "/quota"), q, &v)
	return v, raw, err
}

// DeleteQuota removes the device's override.
func (c *Client) DeleteQuota(ctx context.Context, id string) (DeletedJSON, []byte, error) {
	var v DeletedJSON
	raw, err := c.call(ctx, http.MethodDelete, devicePath(id, "/quota"), nil, &v)
	return v, raw, err
}

// Reset empties the device's window.
func (c *Client) Reset(ctx context.Context, id string) (ResetJSON, []byte, error) {
	var v ResetJSON
	raw, err := c.call(ctx, http.MethodPost, devicePath(id, "/reset"), nil, &v)
	return v, raw, err
}

// Quotas lists the overrides (GET /api/v1/quotas).
func (c *Client) Quotas(ctx context.Context) (OverridesJSON, []byte, error) {
	var v OverridesJSON
	raw, err := c.call(ctx, http.MethodGet, "/api/v1/quotas", nil, &v)
	return v, raw, err
}

// Blocks lists the devices blocked now.
func (c *Client) Blocks(ctx context.Context) (BlocksJSON, []byte, error) {
	var v BlocksJSON
	raw, err := c.call(ctx, http.MethodGet, "/api/v1/blocks", nil, &v)
	return v, raw, err
}

// Unblock lifts a device's block.
func (c *Client) Unblock(ctx context.Context, device string) (UnblockedJSON, []byte, error) {
	var v UnblockedJSON
	raw, err := c.call(ctx, http.MethodDelete, devicePath(device, "/block"), nil, &v)
	return v, raw, err
}

// Rules lists the configured rules and whether each is enforced.
func (c *Client) Rules(ctx context.Context) (RulesJSON, []byte, error) {
	var v RulesJSON
	raw, err := c.call(ctx, http.MethodGet, "/api/v1/rules", nil, &v)
	return v, raw, err
}

// SetRuleEnforce switches a rule between enforcing and shadow mode.
func (c *Client) SetRuleEnforce(ctx context.Context, rule string, enforce bool) (RuleJSON, []byte, error) {
	var v RuleJSON
	raw, err := c.call(ctx, http.MethodPut, "/api/v1/rules/"+url.PathEscape(rule)+"/enforce", enforceBody{Enforce: &enforce}, &v)
	return v, raw, err
}

func groupPath(name, suffix string) string { return "/api/v1/groups/" + url.PathEscape(name) + suffix }

// Groups lists the groups the gateway knows.
func (c *Client) Groups(ctx context.Context) (GroupListJSON, []byte, error) {
	var v GroupListJSON
	raw, err := c.call(ctx, http.MethodGet, "/api/v1/groups", nil, &v)
	return v, raw, err
}

// Group returns a group's quota and its windows' state.
func (c *Client) Group(ctx context.Context, name string) (GroupJSON, []byte, error) {
	var v GroupJSON
	raw, err := c.call(ctx, http.MethodGet, groupPath(name, ""), nil, &v)
	return v, raw, err
}

// SetGroupQuota sets a group's quota override (no policy, no classes).
func (c *Client) SetGroupQuota(ctx context.Context, name string, q SetQuotaJSON) (GroupJSON, []byte, error) {
	var v GroupJSON
	raw, err := c.call(ctx, http.MethodPut, groupPath(name, "/quota"), q, &v)
	return v, raw, err
}

// DeleteGroupQuota deletes a group's quota override.
func (c *Client) DeleteGroupQuota(ctx context.Context, name string) (GroupDeletedJSON, []byte, error) {
	var v GroupDeletedJSON
	raw, err := c.call(ctx, http.MethodDelete, groupPath(name, "/quota"), nil, &v)
	return v, raw, err
}

// Throttled lists up to n devices refused most lately.
func (c *Client) Throttled(ctx context.Context, n int) (ThrottledListJSON, []byte, error) {
	var v ThrottledListJSON
	raw, err := c.call(ctx, http.MethodGet, "/api/v1/throttled?limit="+strconv.Itoa(n), nil, &v)
	return v, raw, err
}

// Forward reports each upstream's forwarding state.
func (c *Client) Forward(ctx context.Context) (ForwardListJSON, []byte, error) {
	var v ForwardListJSON
	raw, err := c.call(ctx, http.MethodGet, "/api/v1/forward", nil, &v)
	return v, raw, err
}

// DeadLetters lists up to n of an upstream's dead letters.
func (c *Client) DeadLetters(ctx context.Context, upstream string, n int) (DeadListJSON, []byte, error) {
	var v DeadListJSON
	raw, err := c.call(ctx, http.MethodGet, deadPath(upstream, "?limit="+strconv.Itoa(n)), nil, &v)
	return v, raw, err
}

// ReplayDead sends an upstream's dead letters again: those of ids, or
// every one when none is given.
func (c *Client) ReplayDead(ctx context.Context, upstream string, ids ...string) (DeadDoneJSON, []byte, error) {
	var v DeadDoneJSON
	raw, err := c.call(ctx, http.MethodPost, deadPath(upstream, "/replay"+idQuery(ids)), nil, &v)
	return v, raw, err
}

// DropDead deletes an upstream's dead letters: those of ids, or every
// one when none is given.
func (c *Client) DropDead(ctx context.Context, upstream string, ids ...string) (DeadDoneJSON, []byte, error) {
	var v DeadDoneJSON
	raw, err := c.call(ctx, http.MethodDelete, deadPath(upstream, idQuery(ids)), nil, &v)
	return v, raw, err
}

// idQuery is the query string of ids ("" for none).
func idQuery(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	return "?" + url.Values{"id": ids}.Encode()
}

func deadPath(upstream, rest string) string {
	return "/api/v1/forward/" + url.PathEscape(upstream) + "/dead" + rest
}

// call sends a request with body (JSON, when not nil) and decodes a 2xx
// answer into out; the raw answer is returned too.
func (c *Client) call(ctx context.Context, method, path string, body, out any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.Addr+path, rd)
	if err != nil {
		return nil, fmt.Errorf("admin address %q: %w", c.Addr, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the method and URL are the caller's to say
		}
		return nil, &TransportError{err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, &TransportError{fmt.Errorf("read the answer from %s: %w", c.Addr, err)}
	}
	if resp.StatusCode/100 != 2 {
		return nil, apiError(resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return b, fmt.Errorf("the admin API answered something other than the expected JSON: %q", b)
	}
	return b, nil
}

// Backup streams GET /api/v1/backup into w: a consistent copy of the
// data file. It needs a client without a timeout shorter than the copy
// takes; ctx bounds it. A response cut short is an error.
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.Addr+"/api/v1/backup", nil)
	if err != nil {
		return 0, fmt.Errorf("admin address %q: %w", c.Addr, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return 0, &TransportError{err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return 0, apiError(resp.StatusCode, b)
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, &TransportError{fmt.Errorf("backup cut short after %d bytes: %w", n, err)}
	}
	return n, nil
}

// BackupFile writes the copy Backup streams to a temporary file beside
// path, syncs it and renames it to path: path appears only once the
// whole copy is in it, and a failed copy leaves nothing behind.
func (c *Client) BackupFile(ctx context.Context, path string) (int64, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".part-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing is there
	defer tmp.Close()
	n, err := c.Backup(ctx, tmp)
	if err != nil {
		return n, err
	}
	if err := tmp.Sync(); err != nil {
		return n, err
	}
	if err := tmp.Close(); err != nil {
		return n, err
	}
	return n, os.Rename(tmp.Name(), path)
}

// HealthTimeout bounds Health.
const HealthTimeout = 3 * time.Second

// Health asks GET /healthz at addr (no token) and returns the status
// and the first 4 KiB of the answer. An address that makes no URL is an
// *AddrError; a request that got no answer, the HTTP client's error.
func Health(ctx context.Context, addr string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, HealthTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
	if err != nil {
		return 0, "", &AddrError{Addr: addr, Err: err}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(body), nil
}

// AddrError is an admin address that makes no URL.
type AddrError struct {
	Addr string
	Err  error
}

func (e *AddrError) Error() string { return fmt.Sprintf("admin address %q: %v", e.Addr, e.Err) }
func (e *AddrError) Unwrap() error { return e.Err }

// apiError is the APIError of a non-2xx answer with body b.
func apiError(status int, b []byte) *APIError {
	var e errorBody
	if json.Unmarshal(b, &e) != nil || e.Error == "" {
		e.Error = strings.TrimSpace(string(b))
		if e.Error == "" {
			e.Error = http.StatusText(status)
		}
	}
	return &APIError{Status: status, Message: e.Error}
}

// Reload asks the gateway to read its configuration again.
func (c *Client) Reload(ctx context.Context) (ReloadJSON, []byte, error) {
	var v ReloadJSON
	raw, err := c.call(ctx, http.MethodPost, "/api/v1/reload", nil, &v)
	return v, raw, err
}
