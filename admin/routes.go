package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/devicegate/devicegate/devicelimit"
)

// openAPI is the API's OpenAPI 3 document, served at /api/v1/openapi.json.
//
//go:embed openapi.json
var openAPI []byte

// route is one method and path the server answers. The same table
// registers the mux and is checked against openapi.json by the tests.
type route struct {
	method, path string
	auth         bool
	handle       func(s *Server, w http.ResponseWriter, r *http.Request)
}

var routes = []route{
	{http.MethodGet, "/healthz", false, (*Server).healthz},
	{http.MethodGet, "/metrics", false, (*Server).metrics},
	{http.MethodGet, "/api/v1/openapi.json", false, (*Server).openapi},
	{http.MethodGet, "/api/v1/devices", true, (*Server).listDevices},
	{http.MethodGet, "/api/v1/rates", true, (*Server).rates},
	{http.MethodGet, "/api/v1/devices/{id}", true, (*Server).getDevice},
	{http.MethodPut, "/api/v1/devices/{id}/quota", true, (*Server).putQuota},
	{http.MethodDelete, "/api/v1/devices/{id}/quota", true, (*Server).deleteQuota},
	{http.MethodGet, "/api/v1/quotas", true, (*Server).listQuotas},
	{http.MethodPost, "/api/v1/devices/{id}/reset", true, (*Server).resetDevice},
	{http.MethodGet, "/api/v1/throttled", true, (*Server).throttled},
	{http.MethodGet, "/api/v1/forward", true, (*Server).forward},
	{http.MethodGet, "/api/v1/forward/history", true, (*Server).forwardHistory},
	{http.MethodGet, "/api/v1/forward/{name}/dead", true, (*Server).listDead},
	{http.MethodDelete, "/api/v1/forward/{name}/dead", true, (*Server).dropDead},
	{http.MethodPost, "/api/v1/forward/{name}/dead/replay", true, (*Server).replayDead},
	{http.MethodGet, "/api/v1/rules", true, (*Server).listRules},
	{http.MethodPut, "/api/v1/rules/{name}/enforce", true, (*Server).putRuleEnforce},
	{http.MethodGet, "/api/v1/blocks", true, (*Server).listBlocks},
	{http.MethodDelete, "/api/v1/devices/{id}/block", true, (*Server).deleteBlock},
	{http.MethodGet, "/api/v1/devices/{id}/deferred", true, (*Server).listDeferred},
	{http.MethodGet, "/api/v1/devices/{id}/history", true, (*Server).deviceHistory},
	{http.MethodGet, "/api/v1/groups", true, (*Server).listGroups},
	{http.MethodGet, "/api/v1/groups/{name}", true, (*Server).getGroup},
	{http.MethodPut, "/api/v1/groups/{name}/quota", true, (*Server).putGroupQuota},
	{http.MethodDelete, "/api/v1/groups/{name}/quota", true, (*Server).deleteGroupQuota},
	{http.MethodGet, "/api/v1/backup", true, (*Server).backup},
	{http.MethodPost, "/api/v1/reload", true, (*Server).reload},
}

// newMux registers one handler per path that dispatches on the method
// itself, so that a wrong method gets a JSON 405 with Allow and an
// unknown path a JSON 404, instead of net/http's plain-text answers.
func (s *Server) newMux() http.Handler {
	mux := http.NewServeMux()
	var paths []string
	byPath := map[string][]route{}
	for _, rt := range routes {
		if _, ok := byPath[rt.path]; !ok {
			paths = append(paths, rt.path)
		}
		byPath[rt.path] = append(byPath[rt.path], rt)
	}
	for _, p := range paths {
		rts := byPath[p]
		var allow []string
		for _, rt := range rts {
			allow = append(allow, rt.method)
		}
		allowHeader := strings.Join(allow, ", ")
		auth := rts[0].auth
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			if auth && !s.authorized(w, r) {
				return
			}
			for _, rt := range rts {
				if r.Method == rt.method {
					rt.handle(s, w, r)
					return
				}
			}
			w.Header().Set("Allow", allowHeader)
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s; allowed: %s", r.Method, p, allowHeader))
		})
	}
	if s.opts.Console != nil {
		mux.Handle("/ui/", s.opts.Console)
		mux.Handle("/ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such route: "+r.URL.Path)
	})
	return mux
}

// authorized checks the bearer token in constant time (over hashes, so
// the token's length does not leak either) and answers 401 when it is
// missing or wrong.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="github.com/devicegate/devicegate"`)
		writeError(w, http.StatusUnauthorized, "missing bearer token: send Authorization: Bearer TOKEN")
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	want := sha256.Sum256([]byte(s.opts.Token))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="github.com/devicegate/devicegate", error="invalid_token"`)
		writeError(w, http.StatusUnauthorized, "invalid bearer token")
		return false
	}
	return true
}

type errorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Error: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":"encode response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// deviceID returns the {id} path segment, unescaped, after checking it
// names a device: valid UTF-8, 1..MaxDeviceID bytes. It answers 400
// otherwise.
func deviceID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if !utf8.ValidString(id) {
		writeError(w, http.StatusBadRequest, "invalid device id: not valid UTF-8")
		return "", false
	}
	if err := devicelimit.ValidDeviceID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return "", false
	}
	return id, true
}

// healthz answers 200 {"status":"ok"}, or 503 {"status":"unhealthy",
// "error":...} while Options.Health reports a problem (the gateway can no
// longer write its data file).
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if s.opts.Health != nil {
		if err := s.opts.Health(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unhealthy", "error": err.Error()})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	s.metricsHandler.ServeHTTP(w, r)
}

// slogPrinter takes promhttp's error log.
type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Warn("serve metrics", "err", fmt.Sprint(v...)) }

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(openAPI)
}

// ceilMillis rounds d up to a whole millisecond: a client that waits
// that long finds room, and "350ms" reads better than "349.999871ms".
func ceilMillis(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r > 0 {
		d += time.Millisecond - r
	}
	return d
}

func formatTick(t devicelimit.Tick) string {
	return t.Time().UTC().Format(time.RFC3339Nano)
}

func (s *Server) getDevice(w http.ResponseWriter, r *http.Request) {
	id, ok := deviceID(w, r)
	if !ok {
		return
	}
	now := s.opts.Clock.Now()
	st := s.opts.Devices.Status(id)
	rd := s.resolveDevice(id, st, now)
	q, classes, src, expires, member := rd.q, rd.classes, rd.src, rd.expires, rd.member
	d, windows, err := s.peekWindows(id, "", q, now)
	if err != nil {
		s.log.Error("device window not read", "device", id, "err", err.Error())
		writeError(w, http.StatusServiceUnavailable, "device window unavailable; see the gateway's log")
		return
	}
	if q.NWindows == 0 {
		windows = nil // limit and window, with the state below
	}
	out := DeviceJSON{
		Device:     id,
		Quota:      quotaOut(q, windows),
		Source:     src.String(),
		Used:       d.Count,
		Remaining:  d.Remaining,
		RetryAfter: ceilMillis(d.RetryAfter).String(),
		Deferred:   st.Deferred,
		Connected:  st.Connected,
	}
	for _, c := range classes {
		_, cw, err := s.peekWindows(id, c.Name, c.Quota, now)
		if err != nil {
			s.log.Error("device window not read", "device", id, "class", c.Name, "err", err.Error())
			writeError(w, http.StatusServiceUnavailable, "device window unavailable; see the gateway's log")
			return
		}
		out.Classes = append(out.Classes, ClassJSON{Name: c.Name, Topics: c.Topics, Quota: quotaOut(c.Quota, cw)})
	}
	if expires != 0 {
		out.OverrideExpiresAt = formatTick(expires)
	}
	out.Group = member.Name
	if st.BlockedUntil != 0 {
		out.BlockedUntil = formatTick(st.BlockedUntil)
		if s.opts.Blocks != nil {
			if b, ok := s.opts.Blocks.Block(id); ok {
				j := blockOf(b)
				out.BlockedSince, out.BlockReason = j.Since, j.Reason
			}
		}
	}
	if st.LastSeen != 0 {
		ls := formatTick(st.LastSeen)
		out.LastSeen = &ls
	}
	s.addConsoleDetail(&out, id, st)
	out.Next = s.nextOf(id, s.windows().PeekAllAt)
	writeJSON(w, http.StatusOK, out)
}

// peekWindows reads device's windows of class under q (one or several)
// for a message of no bytes (a byte window's retry depends on the size):
// the summed-up decision and each window's state.
func (s *Server) peekWindows(device, class string, q devicelimit.Quota, now devicelimit.Tick) (devicelimit.Decision, []WindowJSON, error) {
	ls := q.Limits()
	v, err := s.windows().PeekAllAt(device, class, ls, 0, now)
	if err != nil {
		return devicelimit.Decision{}, nil, err
	}
	out := WindowsJSON(ls)
	for i := range out {
		wd := v.Windows[i]
		out[i].Used, out[i].Remaining, out[i].RetryAfter = &wd.Count, &wd.Remaining, ceilMillis(wd.RetryAfter).String()
	}
	return v.Decision(), out, nil
}

// quotaOut is q in the API's terms; windows, when given, are its
// windows with their state.
func quotaOut(q devicelimit.Quota, windows []WindowJSON) QuotaJSON {
	if q.NWindows == 0 {
		out := QuotaJSON{Limit: q.Limit, Window: q.Window.String(), Policy: q.Policy.String(), Enforce: enforceOut(q), Block: blockOut(q), Feedback: q.Feedback.String()}
		if len(windows) == 1 { // a class's one window, with its state
			out.Used, out.Remaining, out.RetryAfter = windows[0].Used, windows[0].Remaining, windows[0].RetryAfter
		}
		return out
	}
	if windows == nil {
		windows = WindowsJSON(q.Limits())
	}
	return QuotaJSON{Policy: q.Policy.String(), Windows: windows, Enforce: enforceOut(q), Block: blockOut(q), Feedback: q.Feedback.String()}
}

// WindowsJSON writes windows in the API's terms.
func WindowsJSON(ls []devicelimit.Limit) []WindowJSON {
	out := make([]WindowJSON, len(ls))
	for i, l := range ls {
		out[i].Window = l.Window.String()
		if l.Unit == devicelimit.Bytes {
			out[i].Bytes = l.N
		} else {
			out[i].Messages = l.N
		}
	}
	return out
}

func overrideOut(device string, o devicelimit.Override) OverrideJSON {
	out := OverrideJSON{Device: device, Limit: o.Quota.Limit, Window: o.Quota.Window.String(), Policy: o.Quota.Policy.String(), Enforce: enforceOut(o.Quota), Feedback: o.Quota.Feedback.String()}
	if o.Quota.NWindows > 0 {
		out.Limit, out.Window, out.Windows = 0, "", WindowsJSON(o.Quota.Limits())
	}
	if o.ExpiresAt != 0 {
		out.ExpiresAt = formatTick(o.ExpiresAt)
	}
	for _, c := range o.Classes {
		out.Classes = append(out.Classes, ClassJSON{Name: c.Name, Topics: c.Topics, Quota: quotaOut(c.Quota, nil)})
	}
	return out
}

func (s *Server) putQuota(w http.ResponseWriter, r *http.Request) {
	id, ok := deviceID(w, r)
	if !ok {
		return
	}
	body, ok := s.quotaBody(w, r)
	if !ok {
		return
	}
	o, err := parseQuotaBody(body, s.opts.Resolver.Buckets(), s.opts.Clock.Now())
	if err == nil {
		err = s.refuseDefer(o)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.opts.Overrides.SetOverride(id, o); err != nil {
		if badInput(err) {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		s.log.Error("set quota override", "err", err)
		writeError(w, http.StatusInternalServerError, "set quota override failed; see the gateway's log")
		return
	}
	s.log.Info("quota override set", "device", id, "quota", o.Quota.String(), "expires_at", expiresAttr(o.ExpiresAt))
	writeJSON(w, http.StatusOK, overrideOut(id, o))
}

func expiresAttr(t devicelimit.Tick) string {
	if t == 0 {
		return "never"
	}
	return formatTick(t)
}

func badInput(err error) bool {
	return errors.Is(err, devicelimit.ErrInvalidQuota) || errors.Is(err, devicelimit.ErrInvalidPolicy) ||
		errors.Is(err, devicelimit.ErrInvalidDevice) || errors.Is(err, devicelimit.ErrInvalidBuckets)
}

// checkContentType requires application/json (parameters such as
// charset allowed).
func checkContentType(r *http.Request) (int, string) {
	ct := r.Header.Get("Content-Type")
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.TrimSpace(mt)
	if !strings.EqualFold(mt, "application/json") {
		if ct == "" {
			return http.StatusUnsupportedMediaType, "missing Content-Type: send application/json"
		}
		return http.StatusUnsupportedMediaType, fmt.Sprintf("unsupported Content-Type %q: send application/json", ct)
	}
	return 0, ""
}

func (s *Server) deleteQuota(w http.ResponseWriter, r *http.Request) {
	id, ok := deviceID(w, r)
	if !ok {
		return
	}
	deleted, err := s.opts.Overrides.DeleteOverride(id)
	if err != nil {
		if badInput(err) {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		s.log.Error("delete quota override", "err", err)
		writeError(w, http.StatusInternalServerError, "delete quota override failed; see the gateway's log")
		return
	}
	if !deleted {
		writeError(w, http.StatusNotFound, "device has no quota override")
		return
	}
	s.log.Info("quota override deleted", "device", id)
	writeJSON(w, http.StatusOK, DeletedJSON{Device: id, Deleted: true})
}

func (s *Server) listQuotas(w http.ResponseWriter, r *http.Request) {
	ovs := s.opts.Resolver.Overrides(s.opts.Clock.Now())
	out := make([]OverrideJSON, 0, len(ovs))
	for _, o := range ovs {
		if _, group := devicelimit.GroupOfKey(o.Device); group {
			continue // GET /api/v1/groups lists those
		}
		out = append(out, overrideOut(o.Device, o.Override))
	}
	writeJSON(w, http.StatusOK, OverridesJSON{Overrides: out})
}

func (s *Server) resetDevice(w http.ResponseWriter, r *http.Request) {
	id, ok := deviceID(w, r)
	if !ok {
		return
	}
	reset, err := s.windows().Reset(id)
	if errors.Is(err, ErrResetNotDurable) {
		s.log.Error("device window reset not written to the data file (in cluster owner mode: the device's checkpoint in redis); the next snapshot or checkpoint writes it", "device", id, "err", err.Error())
		writeError(w, http.StatusServiceUnavailable, "the device's windows are emptied but not yet in the data file (in cluster owner mode: the device's checkpoint in redis): the next snapshot or checkpoint writes that, and a crash before it can bring the old counts back; repeat the reset, or see the gateway's log")
		return
	}
	if err != nil {
		s.log.Error("device window reset failed", "device", id, "err", err.Error())
		writeError(w, http.StatusServiceUnavailable, "reset failed, nothing changed; see the gateway's log")
		return
	}
	if reset {
		s.log.Info("device window reset", "device", id)
	}
	writeJSON(w, http.StatusOK, ResetJSON{Device: id, Reset: reset})
}

// Bounds of GET /api/v1/throttled?limit=N.
const (
	defaultThrottled = 10
	maxThrottled     = 1000
)

func (s *Server) throttled(w http.ResponseWriter, r *http.Request) {
	n := defaultThrottled
	q := r.URL.Query()
	if vs, ok := q["limit"]; ok {
		if len(vs) != 1 {
			writeError(w, http.StatusBadRequest, "limit given more than once")
			return
		}
		v, err := strconv.Atoi(vs[0])
		if err != nil || v < 1 || v > maxThrottled {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit must be an integer between 1 and %d (got %q)", maxThrottled, vs[0]))
			return
		}
		n = v
	}
	top := s.opts.Throttled.Top(n)
	out := make([]ThrottledJSON, 0, min(len(top), n))
	for _, d := range top[:min(len(top), n)] {
		out = append(out, ThrottledJSON(d))
	}
	writeJSON(w, http.StatusOK, ThrottledListJSON{Devices: out})
}

func (s *Server) forward(w http.ResponseWriter, _ *http.Request) {
	out := ForwardListJSON{Upstreams: []UpstreamJSON{}}
	{
		for _, f := range s.forwardStats() {
			out.Upstreams = append(out.Upstreams, UpstreamJSON{Name: f.Upstream, Connections: f.Connections, Connected: f.Connected,
				LastError: f.LastError, RetryInSeconds: f.RetryIn.Seconds(), Forwarded: f.Forwarded, BacklogMessages: f.Backlog, BacklogBytes: f.BacklogBytes,
				OldestAgeSeconds: f.OldestAge.Seconds(), DroppedOldest: f.DroppedOldest, Refused: f.Refused, Expired: f.Expired, LowSpace: f.LowSpace,
				DeadLetters: f.DeadLetters, DeadLettersByReason: f.DeadByReason})
		}
	}
	writeJSON(w, http.StatusOK, out)
}
