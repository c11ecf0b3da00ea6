package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/devicegate/devicegate/devicelimit"
)

// RuleJSON is a configured rule's runtime state: whether its own quota
// is enforced or in shadow mode.
type RuleJSON struct {
	Rule    string `json:"rule"`
	Enforce bool   `json:"enforce"`
	// WouldRefuse counts, in GET /api/v1/rules, the messages of the
	// devices matching the rule that a quota in shadow mode let through
	// and would have refused.
	WouldRefuse *uint64 `json:"would_refuse,omitempty"`
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
		enforce, _ := s.opts.Resolver.RuleEnforce(name)
		r := RuleJSON{Rule: name, Enforce: enforce}
		if would != nil {
			n := would[name]
			r.WouldRefuse = &n
		}
		out.Rules = append(out.Rules, r)
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

// BlockJSON is a device's block.
type BlockJSON struct {
	Device string `json:"device"`
	Until  string `json:"until"`
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
			out.Blocks = append(out.Blocks, BlockJSON{Device: b.Device, Until: formatTick(b.Until)})
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
