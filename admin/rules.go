package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/devicegate/devicegate/devicelimit"
)

// RuleJSON is a configured rule's runtime state: whether its own quota
// and its topic classes are enforced or in shadow mode, and its group's
// mode, which a switch of the rule leaves alone.
type RuleJSON struct {
	Rule    string `json:"rule"`
	Enforce bool   `json:"enforce"`
	// WouldRefuse counts, in GET /api/v1/rules, the messages of the
	// devices matching the rule that a quota in shadow mode let through
	// and would have refused.
	WouldRefuse *uint64 `json:"would_refuse,omitempty"`
	// Classes are the rule's topic classes and whether each is enforced.
	Classes []RuleClassJSON `json:"classes,omitempty"`
	// Group is the rule's group, never switched with the rule.
	Group *RuleGroupJSON `json:"group,omitempty"`
	// Switched, in the answer of PUT /api/v1/rules/{name}/enforce, names
	// what the switch put in its mode: "quota" (the rule's own) and
	// "class NAME" for each of its topic classes.
	Switched []string `json:"switched,omitempty"`
}

// RuleClassJSON is a rule's topic class in RuleJSON.
type RuleClassJSON struct {
	Name    string `json:"name"`
	Enforce bool   `json:"enforce"`
}

// RuleGroupJSON is a rule's group in RuleJSON: its name (the
// template), whether its configured quota is enforced (an override of
// one group may say otherwise), that a switch of the rule does not
// switch it (always false), and the other rules whose devices count in
// the same groups.
type RuleGroupJSON struct {
	Name       string   `json:"name"`
	Enforce    bool     `json:"enforce"`
	Switched   bool     `json:"switched"`
	SharedWith []string `json:"shared_with,omitempty"`
}

// ruleOut is the named rule's state in the API's terms.
func ruleOut(name string, st devicelimit.RuleState) RuleJSON {
	r := RuleJSON{Rule: name, Enforce: st.Enforce}
	for _, c := range st.Classes {
		r.Classes = append(r.Classes, RuleClassJSON{Name: c.Name, Enforce: c.Enforce})
	}
	if st.Group != "" {
		r.Group = &RuleGroupJSON{Name: st.Group, Enforce: st.GroupEnforce, SharedWith: st.GroupShared}
	}
	return r
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
	var would map[string]uint64
	if s.opts.Stats != nil {
		would = s.opts.Stats.MetricsSnapshot().WouldRefuseByRule
	}
	for _, name := range s.opts.Resolver.RuleNames() {
		st, _ := s.opts.Resolver.RuleState(name)
		r := ruleOut(name, st)
		if would != nil {
			n := would[name]
			r.WouldRefuse = &n
		}
		out.Rules = append(out.Rules, r)
	}
	writeJSON(w, http.StatusOK, out)
}

// putRuleEnforce switches a rule (its own quota and its topic classes,
// not its group) between enforcing and shadow mode, from its devices'
// next message, until the gateway stops; the answer names what it
// switched and what it did not.
func (s *Server) putRuleEnforce(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, ok := s.opts.Resolver.RuleEnforce(name); !ok {
		unknownRule(w, name)
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
	st, err := s.opts.Resolver.SetRuleEnforce(name, *b.Enforce)
	if err != nil {
		// A reload removed the rule while the body came: the same
		// answer as for a rule never configured.
		unknownRule(w, name)
		return
	}
	mode := "enforcing"
	if !*b.Enforce {
		mode = "shadow mode"
	}
	// The answer names what this request switched, in the rules it
	// switched: read back, the state could already be another
	// operator's switch made since (a probe of two operators switching
	// at once saw 1 answer in 4,000 name the other's), or a reload's
	// rules, without the rule's classes and group when it removed it.
	out := ruleOut(name, st)
	out.Switched = []string{"quota"}
	for _, c := range st.Classes {
		out.Switched = append(out.Switched, "class "+c.Name)
	}
	s.log.Info("rule switched at runtime", "rule", name, "mode", mode, "switched", strings.Join(out.Switched, ", "), "group", st.Group)
	writeJSON(w, http.StatusOK, out)
}

// unknownRule answers a switch of a rule not in force: 404 naming it.
func unknownRule(w http.ResponseWriter, name string) {
	writeError(w, http.StatusNotFound, fmt.Sprintf("no rule named %q in limits.rules", name))
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

// BlockJSON is a device's block: until when, since when and why (both
// omitted when the gateway does not know them).
type BlockJSON struct {
	Device string `json:"device"`
	Until  string `json:"until"`
	Since  string `json:"since,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// blockOf is a block in the API's terms.
func blockOf(b BlockedDevice) BlockJSON {
	out := BlockJSON{Device: b.Device, Until: formatTick(b.Until), Reason: b.Reason}
	if b.Since != 0 {
		out.Since = formatTick(b.Since)
	}
	return out
}

// BlocksJSON answers GET /api/v1/blocks.
type BlocksJSON struct {
	Blocks []BlockJSON `json:"blocks"`
}

// UnblockedJSON answers DELETE /api/v1/devices/{id}/block.
type UnblockedJSON struct {
	Device    string `json:"device"`
	Unblocked bool   `json:"unblocked"`
}

func (s *Server) listBlocks(w http.ResponseWriter, _ *http.Request) {
	out := BlocksJSON{Blocks: []BlockJSON{}}
	if s.opts.Blocks != nil {
		for _, b := range s.opts.Blocks.Blocked() {
			out.Blocks = append(out.Blocks, blockOf(b))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteBlock lifts a device's block: its CONNECTs are accepted again.
func (s *Server) deleteBlock(w http.ResponseWriter, r *http.Request) {
	id, ok := deviceID(w, r)
	if !ok {
		return
	}
	if s.opts.Blocks == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("device %q is not blocked", id))
		return
	}
	had, err := s.opts.Blocks.Unblock(id)
	if err != nil {
		s.log.Error("unblock", "device", id, "err", err)
		writeError(w, http.StatusInternalServerError, "unblock failed; see the gateway's log")
		return
	}
	if !had {
		writeError(w, http.StatusNotFound, fmt.Sprintf("device %q is not blocked", id))
		return
	}
	writeJSON(w, http.StatusOK, UnblockedJSON{Device: id, Unblocked: true})
}

// blockOut is a quota's automatic blocking in the API, nil for none.
func blockOut(q devicelimit.Quota) *BlockSpecJSON {
	if q.Block == (devicelimit.Block{}) {
		return nil
	}
	return &BlockSpecJSON{After: q.Block.After, Within: q.Block.Within.String(), For: q.Block.For.String()}
}
