package admin

// GET /api/v1/devices: the devices the gateway tracks, searched by ID
// prefix, filtered, sorted and paged on the server (the console's
// Devices page), and a device's recent refusals.

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// DeviceSummary is a device as the listing sees it: its status and its
// refusals since the broker began tracking it.
type DeviceSummary struct {
	Device string
	Status DeviceStatus
	// Refusals counts its refused publishes; LastRefused is the latest's
	// instant, 0 for none.
	Refusals    uint64
	LastRefused devicelimit.Tick
	// Recent counts its messages admitted in the last 5 minutes; Use is
	// the peak percent of its deciding window in use then.
	Recent, Use uint32
}

// Refusal is one refused publish of a device.
type Refusal struct {
	At                   devicelimit.Tick
	Topic, Class, Reason string
}

// DeviceLister lists the devices the gateway tracks (connected, seen
// lately, or holding a window) and a device's latest refusals.
type DeviceLister interface {
	List() []DeviceSummary
	Refusals(device string) []Refusal
}

// ThrottledWithin is how recent a refusal makes a device "throttled" in
// GET /api/v1/devices?filter=throttled.
const ThrottledWithin = 5 * time.Minute

// Bounds of GET /api/v1/devices?limit=N.
const (
	defaultDevicePage = 50
	maxDevicePage     = 500
)

// DeviceRowJSON is a device in GET /api/v1/devices.
type DeviceRowJSON struct {
	Device       string  `json:"device"`
	Connected    bool    `json:"connected"`
	LastSeen     *string `json:"last_seen"`
	Refusals     uint64  `json:"refusals"`
	LastRefused  string  `json:"last_refused,omitempty"`
	Deferred     int     `json:"deferred"`
	BlockedUntil string  `json:"blocked_until,omitempty"`
	// Source is where its quota comes from: override, rule:NAME, default.
	Source string `json:"source"`
	Shadow bool   `json:"shadow"`
	Group  string `json:"group,omitempty"`
	// Recent counts its messages admitted in the last 5 minutes;
	// UsePercent is the peak share of its deciding window in use then.
	Recent     uint32 `json:"recent"`
	UsePercent uint32 `json:"use_percent"`
}

// DeviceListJSON answers GET /api/v1/devices.
type DeviceListJSON struct {
	// Total is the number of devices matching, of which Devices is the
	// page from Offset.
	Total   int             `json:"total"`
	Offset  int             `json:"offset"`
	Limit   int             `json:"limit"`
	Devices []DeviceRowJSON `json:"devices"`
}

// RefusalJSON is one of a device's recent refusals.
type RefusalJSON struct {
	At     string `json:"at"`
	Topic  string `json:"topic"`
	Class  string `json:"class,omitempty"`
	Reason string `json:"reason"`
}

// deviceQuery is a parsed GET /api/v1/devices query.
type deviceQuery struct {
	prefix        string
	filters       []string
	group, rule   string
	sort          string
	offset, limit int
}

var (
	deviceFilters = []string{"throttled", "blocked", "deferring", "shadow", "override", "connected"}
	deviceSorts   = []string{"device", "refusals", "deferred", "last_seen", "rate", "use"}
)

// parseDeviceQuery reads q, naming the parameter and the value in its
// error.
func parseDeviceQuery(q url.Values) (deviceQuery, error) {
	out := deviceQuery{sort: "device", limit: defaultDevicePage}
	for k := range q {
		switch k {
		case "prefix", "filter", "group", "rule", "sort", "offset", "limit":
		default:
			return out, fmt.Errorf("unknown parameter %q; known: prefix, filter, group, rule, sort, offset, limit", k)
		}
	}
	one := func(k string) (string, bool, error) {
		vs, ok := q[k]
		if !ok {
			return "", false, nil
		}
		if len(vs) != 1 {
			return "", false, fmt.Errorf("%s given more than once", k)
		}
		return vs[0], true, nil
	}
	var err error
	if out.prefix, _, err = one("prefix"); err != nil {
		return out, err
	}
	if out.group, _, err = one("group"); err != nil {
		return out, err
	}
	if out.rule, _, err = one("rule"); err != nil {
		return out, err
	}
	for _, f := range q["filter"] {
		if !slices.Contains(deviceFilters, f) {
			return out, fmt.Errorf("filter must be one of %s (got %q)", strings.Join(deviceFilters, ", "), f)
		}
		out.filters = append(out.filters, f)
	}
	if v, ok, err := one("sort"); err != nil {
		return out, err
	} else if ok {
		if !slices.Contains(deviceSorts, v) {
			return out, fmt.Errorf("sort must be one of %s (got %q)", strings.Join(deviceSorts, ", "), v)
		}
		out.sort = v
	}
	if v, ok, err := one("offset"); err != nil {
		return out, err
	} else if ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return out, fmt.Errorf("offset must be an integer of 0 or more (got %q)", v)
		}
		out.offset = n
	}
	if v, ok, err := one("limit"); err != nil {
		return out, err
	} else if ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxDevicePage {
			return out, fmt.Errorf("limit must be an integer between 1 and %d (got %q)", maxDevicePage, v)
		}
		out.limit = n
	}
	return out, nil
}

// listDevices answers GET /api/v1/devices: every device tracked, plus
// those blocked or with an override, that match the query. With 100,000
// devices it must answer well within the console's 300 ms: it copies
// no summary, sorts pointers, and resolves a device's quota only for a
// filter that needs it and for the rows of the page.
func (s *Server) listDevices(w http.ResponseWriter, r *http.Request) {
	dq, err := parseDeviceQuery(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	now := s.opts.Clock.Now()
	all := s.trackedDevices(now)
	keep := make([]*DeviceSummary, 0, len(all))
	for i := range all {
		d := &all[i]
		if strings.HasPrefix(d.Device, dq.prefix) && s.matches(d, dq, now) {
			keep = append(keep, d)
		}
	}
	sortDevices(keep, dq.sort)
	out := DeviceListJSON{Total: len(keep), Offset: dq.offset, Limit: dq.limit, Devices: []DeviceRowJSON{}}
	if dq.offset < len(keep) {
		for _, d := range keep[dq.offset:min(len(keep), dq.offset+dq.limit)] {
			out.Devices = append(out.Devices, deviceRow(d, s.resolveDevice(d.Device, d.Status, now)))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// trackedDevices returns the lister's devices and those blocked or with
// an override it does not list.
func (s *Server) trackedDevices(now devicelimit.Tick) []DeviceSummary {
	extra := map[string]bool{} // blocked or with an override; true once listed
	if s.opts.Blocks != nil {
		for _, b := range s.opts.Blocks.Blocked() {
			extra[b.Device] = false
		}
	}
	for _, o := range s.opts.Resolver.Overrides(now) {
		if _, group := devicelimit.GroupOfKey(o.Device); !group {
			extra[o.Device] = false
		}
	}
	var sums []DeviceSummary
	if s.opts.Listing != nil {
		sums = s.opts.Listing.List()
	}
	if len(extra) == 0 {
		return sums
	}
	for i := range sums {
		if _, ok := extra[sums[i].Device]; ok {
			extra[sums[i].Device] = true
		}
	}
	for device, listed := range extra {
		if !listed {
			sums = append(sums, DeviceSummary{Device: device, Status: s.opts.Devices.Status(device)})
		}
	}
	return sums
}

// matches reports whether d passes every filter of dq.
func (s *Server) matches(d *DeviceSummary, dq deviceQuery, now devicelimit.Tick) bool {
	var r *resolved // resolved once, when a filter needs it
	res := func() *resolved {
		if r == nil {
			x := s.resolveDevice(d.Device, d.Status, now)
			r = &x
		}
		return r
	}
	for _, f := range dq.filters {
		var ok bool
		switch f {
		case "throttled":
			ok = d.LastRefused != 0 && now.Sub(d.LastRefused) < ThrottledWithin
		case "blocked":
			ok = d.Status.BlockedUntil != 0
		case "deferring":
			ok = d.Status.Deferred > 0
		case "shadow":
			ok = res().q.Shadow
		case "override":
			ok = res().src.Kind == devicelimit.SourceOverride
		case "connected":
			ok = d.Status.Connected
		}
		if !ok {
			return false
		}
	}
	if dq.rule != "" && res().rule.String() != dq.rule && res().rule.String() != "rule:"+dq.rule {
		return false // a rule's name, or "default": the device's rule, overridden or not
	}
	return dq.group == "" || res().member.Name == dq.group
}

// sortDevices sorts ds by key: device ascending, the others descending
// (most refused, most deferred, seen latest first), ties by device.
func sortDevices(ds []*DeviceSummary, key string) {
	slices.SortFunc(ds, func(a, b *DeviceSummary) int {
		var c int
		switch key {
		case "refusals":
			c = cmp.Compare(b.Refusals, a.Refusals)
		case "deferred":
			c = cmp.Compare(b.Status.Deferred, a.Status.Deferred)
		case "last_seen":
			c = cmp.Compare(b.Status.LastSeen, a.Status.LastSeen)
		case "rate":
			c = cmp.Compare(b.Recent, a.Recent)
		case "use":
			c = cmp.Compare(b.Use, a.Use)
		}
		if c != 0 {
			return c
		}
		return strings.Compare(a.Device, b.Device)
	})
}

func deviceRow(d *DeviceSummary, r resolved) DeviceRowJSON {
	row := DeviceRowJSON{Device: d.Device, Connected: d.Status.Connected, Refusals: d.Refusals, Deferred: d.Status.Deferred,
		Source: r.src.String(), Shadow: r.q.Shadow, Group: r.member.Name, Recent: d.Recent, UsePercent: d.Use}
	if d.Status.LastSeen != 0 {
		ls := formatTick(d.Status.LastSeen)
		row.LastSeen = &ls
	}
	if d.LastRefused != 0 {
		row.LastRefused = formatTick(d.LastRefused)
	}
	if d.Status.BlockedUntil != 0 {
		row.BlockedUntil = formatTick(d.Status.BlockedUntil)
	}
	return row
}

// recentRefusals is device's latest refusals in the API's terms.
func (s *Server) recentRefusals(device string) []RefusalJSON {
	if s.opts.Listing == nil {
		return nil
	}
	var out []RefusalJSON
	for _, r := range s.opts.Listing.Refusals(device) {
		out = append(out, RefusalJSON{At: formatTick(r.At), Topic: r.Topic, Class: r.Class, Reason: r.Reason})
	}
	return out
}

// resolved is a device's quota and where it comes from.
type resolved struct {
	q       devicelimit.Quota
	classes []devicelimit.Class
	src     devicelimit.Source
	rule    devicelimit.Source // its rule's (or the default's), overridden or not
	expires devicelimit.Tick   // the override's expiry, 0 for none
	member  devicelimit.Membership
}

// resolveDevice resolves device's quota as its next message would be
// judged: Resolver.Resolve's order, spelled out to learn the override's
// expiry.
func (s *Server) resolveDevice(device string, st DeviceStatus, now devicelimit.Tick) resolved {
	clientID, username := st.ClientID, st.Username
	if !st.Connected {
		// The rules match on what a connection of this device would
		// carry: its ID in the identity's field.
		if s.opts.Identity == devicelimit.IdentityUsername {
			clientID, username = "", device
		} else {
			clientID, username = device, ""
		}
	}
	var r resolved
	rq, classes, rsrc, member := s.opts.Resolver.RuleGroup(clientID, username)
	r.classes, r.member, r.rule = classes, member, rsrc
	if o, ok := s.opts.Resolver.Override(device, now); ok {
		r.q, r.src, r.expires = o.Quota, devicelimit.Source{Kind: devicelimit.SourceOverride}, o.ExpiresAt
		if len(o.Classes) > 0 {
			r.classes = o.Classes
		}
	} else {
		r.q, r.src = rq, rsrc
	}
	return r
}

// addConsoleDetail adds to a device's status its connection and its
// recent refusals.
func (s *Server) addConsoleDetail(out *DeviceJSON, device string, st DeviceStatus) {
	if st.Connected {
		out.ClientID, out.Username, out.Remote, out.Protocol = st.ClientID, st.Username, st.Remote, int(st.Protocol)
		if st.Since != 0 {
			out.ConnectedSince = formatTick(st.Since)
		}
	}
	out.Refusals = s.recentRefusals(device)
}
