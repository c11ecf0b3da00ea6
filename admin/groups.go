package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"unicode/utf8"

	"devicegate/devicelimit"
)

// GroupMembers is a group a device joined on this gateway since it
// started: its name, the label its metrics count under (the configured
// name or template), the quota its rule gives it, and how many of its
// devices are connected here now.
type GroupMembers struct {
	Name      string
	Label     string
	Quota     devicelimit.Quota
	Connected int
}

// Groups lists the groups devices joined on this gateway since start.
type Groups interface {
	Groups() []GroupMembers
}

// GroupJSON is a group's status (GET /api/v1/groups/{name}) or entry
// (GET /api/v1/groups).
type GroupJSON struct {
	Group string `json:"group"`
	// Label is what its metrics count under: its configured name, or
	// the template that made it ("{tenant}").
	Label string `json:"label,omitempty"`
	// Quota is the group's windows, with their state in a status.
	Quota QuotaJSON `json:"quota"`
	// Source is "rule" (the configuration) or "override".
	Source            string `json:"source"`
	OverrideExpiresAt string `json:"override_expires_at,omitempty"`
	// Connected is the number of its devices connected to this gateway.
	Connected int `json:"connected"`
}

// GroupListJSON is the answer of GET /api/v1/groups.
type GroupListJSON struct {
	Groups []GroupJSON `json:"groups"`
}

// GroupDeletedJSON answers DELETE /api/v1/groups/{name}/quota.
type GroupDeletedJSON struct {
	Group   string `json:"group"`
	Deleted bool   `json:"deleted"`
}

// groupName returns the {name} path segment after checking it names a
// group: valid UTF-8, 1..MaxGroupName bytes without NUL; 400 otherwise.
func groupName(w http.ResponseWriter, r *http.Request) (string, bool) {
	name := r.PathValue("name")
	if !utf8.ValidString(name) {
		writeError(w, http.StatusBadRequest, "invalid group name: not valid UTF-8")
		return "", false
	}
	if err := devicelimit.ValidGroupName(name); err != nil {
		writeError(w, http.StatusBadRequest, "invalid group name: "+strings.TrimPrefix(err.Error(), devicelimit.ErrInvalidDevice.Error()+": group "))
		return "", false
	}
	return name, true
}

// groups returns every group this gateway knows, by name: those its
// devices joined since start, those the configuration names (fixed
// names), and those with an override.
func (s *Server) groups() map[string]GroupJSON {
	now := s.opts.Clock.Now()
	out := map[string]GroupJSON{}
	if s.opts.Groups != nil {
		for _, g := range s.opts.Groups.Groups() {
			out[g.Name] = GroupJSON{Group: g.Name, Label: g.Label, Quota: quotaOut(g.Quota, nil), Source: "rule", Connected: g.Connected}
		}
	}
	for _, label := range s.opts.Resolver.GroupLabels() {
		if m, ok := s.opts.Resolver.GroupConfigured(label); ok {
			if _, seen := out[m.Name]; !seen {
				out[m.Name] = GroupJSON{Group: m.Name, Label: m.Label, Quota: quotaOut(m.Quota, nil), Source: "rule"}
			}
		}
	}
	for _, o := range s.opts.Resolver.Overrides(now) {
		if name, ok := devicelimit.GroupOfKey(o.Device); ok {
			g := out[name]
			g.Group, g.Quota, g.Source = name, quotaOut(o.Quota, nil), "override"
			if o.ExpiresAt != 0 {
				g.OverrideExpiresAt = formatTick(o.ExpiresAt)
			}
			out[name] = g
		}
	}
	return out
}

func (s *Server) listGroups(w http.ResponseWriter, _ *http.Request) {
	all := s.groups()
	out := GroupListJSON{Groups: make([]GroupJSON, 0, len(all))}
	for _, g := range all {
		out.Groups = append(out.Groups, g)
	}
	sort.Slice(out.Groups, func(i, j int) bool { return out.Groups[i].Group < out.Groups[j].Group })
	writeJSON(w, http.StatusOK, out)
}

// groupQuota returns the quota in force for the group named name: its
// override's, else the one its rule gives it (from a connected device,
// or a fixed name in the configuration).
func (s *Server) groupQuota(name string) (devicelimit.Quota, bool) {
	now := s.opts.Clock.Now()
	if o, ok := s.opts.Resolver.Override(devicelimit.GroupKey(name), now); ok {
		return o.Quota, true
	}
	if s.opts.Groups != nil {
		for _, g := range s.opts.Groups.Groups() {
			if g.Name == name {
				return g.Quota, true
			}
		}
	}
	m, ok := s.opts.Resolver.GroupConfigured(name)
	return m.Quota, ok
}

func (s *Server) getGroup(w http.ResponseWriter, r *http.Request) {
	name, ok := groupName(w, r)
	if !ok {
		return
	}
	g, ok := s.groups()[name]
	q, known := s.groupQuota(name)
	if !ok || !known {
		writeError(w, http.StatusNotFound, fmt.Sprintf("group %q is not known here: no device of it connected since this gateway started, and neither the configuration nor an override names it", name))
		return
	}
	_, windows, err := s.peekWindows(devicelimit.GroupKey(name), "", q, s.opts.Clock.Now())
	if err != nil {
		s.log.Error("group window not read", "group", name, "err", err.Error())
		writeError(w, http.StatusServiceUnavailable, "group window unavailable; see the gateway's log")
		return
	}
	g.Quota = QuotaJSON{Windows: windows, Enforce: enforceOut(q)}
	writeJSON(w, http.StatusOK, g)
}

func (s *Server) putGroupQuota(w http.ResponseWriter, r *http.Request) {
	name, ok := groupName(w, r)
	if !ok {
		return
	}
	body, ok := s.quotaBody(w, r)
	if !ok {
		return
	}
	o, err := parseGroupQuotaBody(body, s.opts.Resolver.Buckets(), s.opts.Clock.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.opts.Overrides.SetOverride(devicelimit.GroupKey(name), o); err != nil {
		if badInput(err) {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		s.log.Error("set group quota override", "err", err)
		writeError(w, http.StatusInternalServerError, "set group quota override failed; see the gateway's log")
		return
	}
	s.log.Info("group quota override set", "group", name, "quota", o.Quota.String(), "expires_at", expiresAttr(o.ExpiresAt))
	out := GroupJSON{Group: name, Quota: quotaOut(o.Quota, nil), Source: "override"}
	if o.ExpiresAt != 0 {
		out.OverrideExpiresAt = formatTick(o.ExpiresAt)
	}
	writeJSON(w, http.StatusOK, out)
}

// parseGroupQuotaBody reads a group's quota body: a device quota body
// without what a group does not have (policy, block, classes).
func parseGroupQuotaBody(body []byte, buckets int, now devicelimit.Tick) (devicelimit.Override, error) {
	var probe map[string]json.RawMessage
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&probe); err == nil {
		for _, f := range []string{"policy", "block", "classes"} {
			if _, ok := probe[f]; ok {
				return devicelimit.Override{}, fmt.Errorf("%s: a group has none (its devices' quotas have them): send limit and window, or windows, and enforce", f)
			}
		}
	}
	o, err := parseQuotaBody(body, buckets, now)
	if err != nil {
		return o, err
	}
	return o, devicelimit.ValidateGroupQuota(o.Quota, buckets)
}

func (s *Server) deleteGroupQuota(w http.ResponseWriter, r *http.Request) {
	name, ok := groupName(w, r)
	if !ok {
		return
	}
	deleted, err := s.opts.Overrides.DeleteOverride(devicelimit.GroupKey(name))
	if err != nil {
		s.log.Error("delete group quota override", "err", err)
		writeError(w, http.StatusInternalServerError, "delete group quota override failed; see the gateway's log")
		return
	}
	if !deleted {
		writeError(w, http.StatusNotFound, fmt.Sprintf("group %q has no quota override", name))
		return
	}
	s.log.Info("group quota override deleted", "group", name)
	writeJSON(w, http.StatusOK, GroupDeletedJSON{Group: name, Deleted: true})
}

// quotaBody reads a quota request's JSON body, answering 415, 413 or
// 400 when it cannot.
func (s *Server) quotaBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if status, msg := checkContentType(r); status != 0 {
		writeError(w, status, msg)
		return nil, false
	}
	body, err := readBody(w, r)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", maxBody))
			return nil, false
		}
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return nil, false
	}
	return body, true
}
