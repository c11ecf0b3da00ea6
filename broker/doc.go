// Package broker is the gateway's MQTT side: an embedded mochi-mqtt
// server with TCP, TLS and WebSocket listeners, device authentication
// and the topic ACL (the auth hook; allow-all by default), the throttle
// hook that checks every device publish against its quota
// in a devicelimit.Table, and the deferral queue.
//
// Decisions, per docs/design.md "Data flow of one publish":
//
//	allowed            forwarded, acked normally
//	over, drop, QoS 0  dropped
//	over, drop, 3.1.1  PUBACK/PUBREC 0x00, not forwarded (3.1.1 cannot say no)
//	over, drop, v5     PUBACK 0x97 (QoS 1) or PUBREC 0x97 (QoS 2) with a
//	                   reason string "quota exceeded: N messages per T, retry after D"
//	over, defer        stored durably, then acked 0x00 (PUBACK, or PUBREC
//	                   for QoS 2; QoS 0 has no ack) and released later
//	defer, queue full  as over, drop (reason "..., deferral queue full")
//	over, disconnect   v5: DISCONNECT 0x96 with the same kind of reason
//	                   string; 3.1.1: connection closed. Either way the
//	                   device's will is published, as for any connection
//	                   the server drops.
//
// A device is named by its client ID or its username (Options.Identity);
// all its connections share one window, and a reconnect keeps it. Messages
// the server injects itself (cl.Net.Inline) are never counted. A
// throttled device is logged at most once per window; per-message counts
// are in Stats.
//
// # Deferral
//
// Under policy defer, a message over the limit is kept in
// Options.Defer (a persist.Store in the gateway) and acked only once it
// is durable, so an acked message survives a crash. While a device has
// messages queued, its new messages queue behind them even when its
// window has room: a device's messages are released in the order they
// were accepted. The queue is bounded per device and in total
// (DeferLimits); a message that does not fit is refused like a message
// over quota under policy drop.
//
// A release loop publishes queued messages as their device's window
// admits them, so a burst comes out smoothed to the quota: each release
// is counted in the window like a message the device sent. Devices wait
// in a min-heap ordered by the instant their window next admits a
// message; the loop sleeps until the earliest of them, so devices with
// nothing due cost nothing. Released messages keep their topic, payload,
// QoS, retain flag and MQTT 5 properties (the message expiry interval
// less the time waited) and carry the device's ID as their origin, so
// the device's own No Local subscriptions skip them. A message that waited longer than
// DeferLimits.MaxAge, or past its MQTT 5 message expiry interval, is
// dropped when its turn comes, never released late.
//
// Released messages are deleted from the store in batches, at most every
// 100 ms. Release is at-least-once: a crash between a release and its
// deletion releases the message again after the restart. Start restores
// the queue from the store before it listens.
//
// # Authentication and limits
//
// The auth hook runs before the throttle. At CONNECT it applies the
// connection limits (Limits: client-ID length, keepalive bounds,
// MaxDevices), authenticates the client by password (auth.Credentials)
// or by its verified TLS client certificate, and refuses with a reason
// code and string of its own; a refused client never reaches the
// throttle. Afterwards it answers mochi's ACL checks: a device publishes
// within its publish template and subscribes within its subscribe
// template, a consumer subscribes anywhere and publishes nowhere, so a
// publish outside the device's prefix is refused before it is counted.
// The listeners close connections over the per-address connect rate
// before reading them.
//
// It is the only package that imports mochi.
package broker
