package admin

import "encoding/json"

// The admin API's JSON answers, as the server writes them and as Client
// (and so `gateway quota` and the simulator) reads them: one definition
// for both sides.

// QuotaJSON is a quota: limit messages per window, and the policy over it.
type QuotaJSON struct {
	Limit  int    `json:"limit,omitempty"`
	Window string `json:"window,omitempty"`
	// Policy is absent in a group's quota (a group has no policy).
	Policy string `json:"policy,omitempty"`
	// Enforce is false for a quota in shadow mode, omitted otherwise.
	Enforce *bool `json:"enforce,omitempty"`
	// Block is the quota's automatic blocking, when it has one.
	Block *BlockSpecJSON `json:"block,omitempty"`
	// Feedback is the quota's feedback mode ("off", "refusals",
	// "always", "below 25%"), omitted when the quota sets none.
	Feedback string `json:"feedback,omitempty"`
	// Windows are a quota's windows when it has several (then Limit and
	// Window are omitted).
	Windows []WindowJSON `json:"windows,omitempty"`
	// Used, Remaining and RetryAfter are a topic class's one window's
	// state, in a device's status.
	Used       *int   `json:"used,omitempty"`
	Remaining  *int   `json:"remaining,omitempty"`
	RetryAfter string `json:"retry_after,omitempty"`
}

// BlockSpecJSON is a quota's automatic blocking: a device refused After
// times within Within is blocked for For.
type BlockSpecJSON struct {
	After  int    `json:"after"`
	Within string `json:"within"`
	For    string `json:"for"`
}

// ClassJSON is a topic class of a device's rule, the default or its
// override; in its status, with its windows' state.
type ClassJSON struct {
	Name   string    `json:"name"`
	Topics []string  `json:"topics"`
	Quota  QuotaJSON `json:"quota"`
}

// WindowJSON is one window of a quota of several, and in a device's
// status its state now.
type WindowJSON struct {
	Messages   int    `json:"messages,omitempty"`
	Bytes      int    `json:"bytes,omitempty"`
	Window     string `json:"window"`
	Used       *int   `json:"used,omitempty"`
	Remaining  *int   `json:"remaining,omitempty"`
	RetryAfter string `json:"retry_after,omitempty"`
}

// DeviceJSON answers GET /api/v1/devices/{id}.
type DeviceJSON struct {
	Device            string    `json:"device"`
	Quota             QuotaJSON `json:"quota"`
	Source            string    `json:"source"`
	OverrideExpiresAt string    `json:"override_expires_at,omitempty"`
	Used              int       `json:"used"`
	Remaining         int       `json:"remaining"`
	RetryAfter        string    `json:"retry_after"`
	Deferred          int       `json:"deferred"`
	BlockedUntil      string    `json:"blocked_until,omitempty"`
	// BlockedSince and BlockReason are the block's start and why it was
	// made; omitted when not blocked or not known (BlockedDevice).
	BlockedSince string  `json:"blocked_since,omitempty"`
	BlockReason  string  `json:"block_reason,omitempty"`
	Connected    bool    `json:"connected"`
	LastSeen     *string `json:"last_seen"`
	// Group is the group the device is in by its rule; "" for none.
	Group string `json:"group,omitempty"`
	// Classes are the device's topic classes (its override's, else its
	// rule's or the default's), each with its windows' state.
	Classes []ClassJSON `json:"classes,omitempty"`
	// ClientID, Username, Remote, Protocol and ConnectedSince describe
	// its live connection (the latest when several); omitted when it
	// has none.
	ClientID       string `json:"client_id,omitempty"`
	Username       string `json:"username,omitempty"`
	Remote         string `json:"remote,omitempty"`
	Protocol       int    `json:"protocol,omitempty"`
	ConnectedSince string `json:"connected_since,omitempty"`
	// Refusals are its latest refused publishes, latest first.
	Refusals []RefusalJSON `json:"refusals,omitempty"`
	// Next is what its next message would get now: for its own quota,
	// then each topic class; only the block when blocked.
	Next []NextJSON `json:"next,omitempty"`
}

// OverrideJSON is a device's quota override: the answer of PUT
// /api/v1/devices/{id}/quota and an entry of GET /api/v1/quotas.
type OverrideJSON struct {
	Device    string `json:"device"`
	Limit     int    `json:"limit,omitempty"`
	Window    string `json:"window,omitempty"`
	Policy    string `json:"policy"`
	Enforce   *bool  `json:"enforce,omitempty"` // false: shadow mode
	ExpiresAt string `json:"expires_at,omitempty"`
	// Feedback is the override's feedback mode, as in QuotaJSON.
	Feedback string `json:"feedback,omitempty"`
	// Windows are an override's windows when it has several (then
	// Limit and Window are omitted).
	Windows []WindowJSON `json:"windows,omitempty"`
	// Classes are the override's topic classes, which replace the
	// device's rule's.
	Classes []ClassJSON `json:"classes,omitempty"`
}

// OverridesJSON answers GET /api/v1/quotas.
type OverridesJSON struct {
	Overrides []OverrideJSON `json:"overrides"`
}

// DeletedJSON answers DELETE /api/v1/devices/{id}/quota.
type DeletedJSON struct {
	Device  string `json:"device"`
	Deleted bool   `json:"deleted"`
}

// ResetJSON answers POST /api/v1/devices/{id}/reset.
type ResetJSON struct {
	Device string `json:"device"`
	Reset  bool   `json:"reset"`
}

// ThrottledJSON is a device and how often it was refused lately.
type ThrottledJSON struct {
	Device  string `json:"device"`
	Refused uint64 `json:"refused"`
}

// ThrottledListJSON answers GET /api/v1/throttled.
type ThrottledListJSON struct {
	Devices []ThrottledJSON `json:"devices"`
}

// SetQuotaJSON is the body of PUT /api/v1/devices/{id}/quota as a client
// sends it (the server reads it strictly: parseQuotaBody).
type SetQuotaJSON struct {
	Limit  int    `json:"limit,omitempty"`
	Window string `json:"window,omitempty"`
	// Windows, instead of Limit and Window: several windows.
	Windows   []WindowJSON `json:"windows,omitempty"`
	Policy    string       `json:"policy,omitempty"`     // the server's default (drop) when empty
	Enforce   *bool        `json:"enforce,omitempty"`    // false: shadow mode
	ExpiresAt string       `json:"expires_at,omitempty"` // RFC 3339; none when empty
	// Feedback is off, refusals, always or "below N%"; the default when
	// empty (docs/device-feedback.md).
	Feedback string `json:"feedback,omitempty"`
	// Classes are topic classes that replace the device's rule's.
	Classes []SetClassJSON `json:"classes,omitempty"`
}

// SetClassJSON is a topic class of an override as a client sends it.
type SetClassJSON struct {
	Name   string       `json:"name"`
	Topics []string     `json:"topics"`
	Quota  SetQuotaJSON `json:"quota"`
}

// MarshalJSON sends limit and window (even 0, for the server to say
// what is wrong) unless the quota is of several windows.
func (q SetQuotaJSON) MarshalJSON() ([]byte, error) {
	type plain SetQuotaJSON
	if len(q.Windows) > 0 {
		return json.Marshal(plain(q))
	}
	return json.Marshal(struct {
		plain
		Limit  int    `json:"limit"`
		Window string `json:"window"`
	}{plain(q), q.Limit, q.Window})
}

// UpstreamJSON is one upstream's forwarding state.
type UpstreamJSON struct {
	Name        string `json:"name"`
	Connections int    `json:"connections"` // configured
	Connected   int    `json:"connected"`   // of them, up
	// LastError says why a connection is down ("" when none is).
	LastError string `json:"last_error,omitempty"`
	// RetryInSeconds is, while a connection waits to connect again, how
	// long until it tries (the soonest); absent otherwise.
	RetryInSeconds   float64 `json:"retry_in_seconds,omitempty"`
	Forwarded        uint64  `json:"forwarded"`
	BacklogMessages  int64   `json:"backlog_messages"`
	BacklogBytes     int64   `json:"backlog_bytes"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	DroppedOldest    uint64  `json:"dropped_oldest"`
	Refused          uint64  `json:"refused"`
	Expired          uint64  `json:"expired"`
	// LowSpace counts those of dropped_oldest and refused that went
	// because the data file's disk was at its free-space floor.
	LowSpace uint64 `json:"low_space"`
	// DeadLetters is how many messages the upstream's dead-letter logs
	// hold; DeadLettersByReason counts those moved there since start.
	DeadLetters         int               `json:"dead_letters"`
	DeadLettersByReason map[string]uint64 `json:"dead_letters_by_reason,omitempty"`
}

// ForwardListJSON answers GET /api/v1/forward.
type ForwardListJSON struct {
	Upstreams []UpstreamJSON `json:"upstreams"`
}
