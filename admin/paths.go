package admin

import (
	"fmt"
	"net/http"
	"path"
	"strings"
)

// wildcardNames say what a path wildcard names, for the answer to an
// empty or malformed one.
var wildcardNames = map[string]string{"{id}": "device ID", "{name}": "name"}

// checkPaths answers a path net/http's mux would redirect to its clean
// form (an empty segment, ".", "..", a trailing slash): a 307 the
// OpenAPI document does not list, to a path that then answers 404 or
// 405. A path that is a route's but for an empty or malformed wildcard
// segment gets 400 naming it (after the route's authorization), any
// other 404 (405 when the route takes other methods only). Clean paths
// go to next unchanged.
func (s *Server) checkPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The escaped path: "%2E%2E" and "a%2F%2Fb" are a device's ID.
		p := r.URL.EscapedPath()
		// "/ui/" is the console's first page (Options.Console).
		if p == "" || p == "/" || p == "/ui/" || path.Clean(p) == p {
			next.ServeHTTP(w, r)
			return
		}
		segs := strings.Split(p, "/")
		var allow []string
		for _, rt := range routes {
			what, seg, ok := malformedWildcard(strings.Split(rt.path, "/"), segs)
			if !ok {
				continue
			}
			if rt.auth && !s.authorized(w, r) {
				return
			}
			if rt.method != r.Method {
				allow = append(allow, rt.method)
				continue
			}
			if seg == "" {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("path %s: the %s is empty", p, what))
			} else {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("path %s: the %s %q is not valid", p, what, seg))
			}
			return
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s; allowed: %s", r.Method, p, strings.Join(allow, ", ")))
			return
		}
		writeError(w, http.StatusNotFound, "no such route: "+p)
	})
}

// malformedWildcard reports whether the path segments segs are the
// route template tsegs's but for a wildcard segment that is empty, "."
// or "..": what the first such wildcard names, and the segment.
func malformedWildcard(tsegs, segs []string) (what, seg string, ok bool) {
	if len(tsegs) != len(segs) {
		return "", "", false
	}
	for i, ts := range tsegs {
		name, wild := wildcardNames[ts]
		switch {
		case !wild && ts != segs[i]:
			return "", "", false
		case wild && !ok && (segs[i] == "" || segs[i] == "." || segs[i] == ".."):
			what, seg, ok = name, segs[i], true
		}
	}
	return what, seg, ok
}
