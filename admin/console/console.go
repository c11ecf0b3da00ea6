// Package console is the gateway's operator console: a few static files
// (one HTML page, its script and its style sheet, embedded in the
// binary) that the admin server serves under /ui/. The page reads and
// changes the gateway through the admin API only, sending the admin
// token as a bearer header with every call; the files themselves hold
// nothing secret and are served to anyone who reaches the listener.
package console

import (
	"bytes"
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var files embed.FS

// Policy is the Content-Security-Policy of every file served: scripts
// and styles from the gateway's origin only (no inline script, no
// eval), requests to that origin only, no framing.
const Policy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'none'; frame-ancestors 'none'; base-uri 'none'"

// Handler serves the console's files under /ui/: /ui/ is the page,
// anything else under it a file of static/ or a 404.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", Policy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		name := strings.TrimPrefix(path.Clean(r.URL.Path), "/ui")
		if name == "" || name == "/" {
			name = "/index.html"
		}
		b, err := fs.ReadFile(files, "static"+name)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
	})
}
