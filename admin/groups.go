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

	"github.com/devicegate/devicegate/devicelimit"
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

// Groups lists the groups devices joined on this gateway since start,
// and in a cluster those joined on the others (Connected 0 then).
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
		msg := err.Error()
		var fe *devicelimit.FieldError
		if errors.As(err, &fe) {
			msg = fe.Msg
		}
		writeError(w, http.StatusBadRequest, "invalid group name: "+msg)
		return "", false
	}
	return name, true
}

// knownGroup is a group this gateway knows, with the quota in force.
type knownGroup struct {
	GroupJSON
	quota devicelimit.Quota
}

// groups returns every group this gateway knows, by name: those its
// devices joined since start, those the configuration names (fixed
// names), and those with an override, whose quota is then the one in
// force.
func (s *Server) groups() map[string]knownGroup {
	now := s.opts.Clock.Now()
	out := map[string]knownGroup{}
	if s.opts.Groups != nil {
		for _, g := range s.opts.Groups.Groups() {
			out[g.Name] = knownGroup{GroupJSON{Group: g.Name, Label: g.Label, Source: "rule", Connected: g.Connected}, g.Quota}
		}
	}
	for _, label := range s.opts.Resolver.GroupLabels() {
		if m, ok := s.opts.Resolver.GroupConfigured(label); ok {
			if _, seen := out[m.Name]; !seen {
				out[m.Name] = knownGroup{GroupJSON{Group: m.Name, Label: m.Label, Source: "rule"}, m.Quota}
			}
		}
	}
	for _, o := range s.opts.Resolver.Overrides(now) {
		if name, ok := devicelimit.GroupOfKey(o.Device); ok {
			g := out[name]
			g.Group, g.quota, g.Source = name, o.Quota, "override"
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
		g.Quota = quotaOut(g.quota, nil)
		out.Groups = append(out.Groups, g.GroupJSON)
	}
	sort.Slice(out.Groups, func(i, j int) bool { return out.Groups[i].Group < out.Groups[j].Group })
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getGroup(w http.ResponseWriter, r *http.Request) {
	name, ok := groupName(w, r)
	if !ok {
		return
	}
	g, ok := s.groups()[name]
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("group %q is not known here: no device of it connected since this gateway started (in a cluster: to any gateway), and neither the configuration nor an override names it", name))
		return
	}
	_, windows, err := s.peekWindows(devicelimit.GroupKey(name), "", g.quota, s.opts.Clock.Now())
	if err != nil {
		s.log.Error("group window not read", "group", name, "err", err.Error())
		writeError(w, http.StatusServiceUnavailable, "group window unavailable; see the gateway's log")
		return
	}
	g.Quota = QuotaJSON{Windows: windows, Enforce: enforceOut(g.quota)}
	writeJSON(w, http.StatusOK, g.GroupJSON)
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
	if !s.opts.Resolver.GroupPossible(name) {
		// An override no device can ever join: most likely a typo.
		labels := s.opts.Resolver.GroupLabels()
		msg := fmt.Sprintf("no rule makes a group named %q: the configured groups are %s; nothing was set", name, strings.Join(labels, ", "))
		if len(labels) == 0 {
			msg = fmt.Sprintf("no rule makes a group named %q: no rule (nor limits.default) has a group; nothing was set", name)
		}
		writeError(w, http.StatusNotFound, msg)
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
