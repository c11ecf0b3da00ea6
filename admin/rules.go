package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"devicegate/devicelimit"
)

// RuleJSON is a configured rule's runtime state: whether its own quota
// is enforced or in shadow mode.
type RuleJSON struct {
	Rule    string `json:"rule"`
	Enforce bool   `json:"enforce"`
}

// RulesJSON answers GET /api/v1/rules.
type RulesJSON struct {
	Rules []RuleJSON `json:"rules"`
}

// enforceBody is the body of PUT /api/v1/rules/{name}/enforce.
type enforceBody struct {
	Enforce *bool `json:"enforce"`
}

func (s *Server) listRules(w http.ResponseWriter, _ *http.Request) {
	out := RulesJSON{Rules: []RuleJSON{}}
	for _, name := range s.opts.Resolver.RuleNames() {
		enforce, _ := s.opts.Resolver.RuleEnforce(name)
		out.Rules = append(out.Rules, RuleJSON{Rule: name, Enforce: enforce})
	}
	writeJSON(w, http.StatusOK, out)
}

// putRuleEnforce switches a rule's own quota between enforcing and
// shadow mode, from its devices' next message, until the gateway stops.
func (s *Server) putRuleEnforce(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, ok := s.opts.Resolver.RuleEnforce(name); !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no rule named %q in limits.rules", name))
		return
	}
	if status, msg := checkContentType(r); status != 0 {
		writeError(w, status, msg)
		return
	}
	raw, err := readBody(w, r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	var b enforceBody
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil || b.Enforce == nil {
		if err == nil || errors.Is(err, io.EOF) {
			err = errors.New(`send {"enforce": true} or {"enforce": false}`)
		}
		writeError(w, http.StatusBadRequest, "bad body: "+err.Error())
		return
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "bad body: data after the object")
		return
	}
	if err := s.opts.Resolver.SetRuleEnforce(name, *b.Enforce); err != nil {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	mode := "enforcing"
	if !*b.Enforce {
		mode = "shadow mode"
	}
	s.log.Info("rule switched at runtime", "rule", name, "mode", mode)
	writeJSON(w, http.StatusOK, RuleJSON{Rule: name, Enforce: *b.Enforce})
}

// enforceOut is a quota's enforce field in the API: false in shadow
// mode, omitted when enforced.
func enforceOut(q devicelimit.Quota) *bool {
	if q.Shadow {
		f := false
		return &f
	}
	return nil
}
