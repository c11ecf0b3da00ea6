package admin

import (
	"errors"
	"net/http"
)

// ErrReloadRefused is the error of a reload refused because the file
// changes keys that need a restart: 409.
var ErrReloadRefused = errors.New("reload refused")

// ReloadChange is a key a reload changed.
type ReloadChange struct {
	Key string `json:"key"`
	Old string `json:"old"`
	New string `json:"new"`
}

// ReloadJSON answers POST /api/v1/reload.
type ReloadJSON struct {
	Changes []ReloadChange `json:"changes"`
}

// reload is POST /api/v1/reload: the gateway reads its configuration
// again (Options.Reload). 200 with the changed keys; 409 when a key that
// needs a restart changed (ErrReloadRefused); 400 when the file does not
// parse or validate, or a file it names cannot be read. Nothing changes
// unless 200.
func (s *Server) reload(w http.ResponseWriter, _ *http.Request) {
	if s.opts.Reload == nil {
		writeError(w, http.StatusNotFound, "this gateway cannot reload its configuration")
		return
	}
	changes, err := s.opts.Reload()
	switch {
	case errors.Is(err, ErrReloadRefused):
		writeError(w, http.StatusConflict, err.Error())
	case err != nil:
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		if changes == nil {
			changes = []ReloadChange{}
		}
		writeJSON(w, http.StatusOK, ReloadJSON{Changes: changes})
	}
}
