package admin

import (
	"fmt"
	"io"
	"net/http"
	"time"
)

// backup is GET /api/v1/backup: a consistent copy of the data file
// (Options.Backup), streamed as application/octet-stream. An error
// before the first byte is a JSON 500; after it, the connection is cut
// short (the client sees a body shorter than it should be, or a broken
// chunked encoding), never a copy that looks whole.
func (s *Server) backup(w http.ResponseWriter, _ *http.Request) {
	if s.opts.Backup == nil {
		writeError(w, http.StatusNotFound, "no data file to back up")
		return
	}
	lw := &lazyWriter{w: w, name: "devicegate-" + time.Now().UTC().Format("20060102T150405Z") + ".db"}
	n, err := s.opts.Backup(lw)
	if err == nil {
		s.log.Info("backup sent", "bytes", n)
		return
	}
	s.log.Error("backup failed", "bytes", n, "error", err)
	if !lw.started {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	panic(http.ErrAbortHandler) // cut the response: a partial copy must not look whole
}

// lazyWriter sends the headers of the backup with its first byte, so
// that an error before it can still be answered in JSON.
type lazyWriter struct {
	w       http.ResponseWriter
	name    string
	started bool
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.started = true
		h := l.w.Header()
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", l.name))
		h.Set("Cache-Control", "no-store")
		l.w.WriteHeader(http.StatusOK)
	}
	return l.w.Write(p)
}

var _ io.Writer = (*lazyWriter)(nil)
