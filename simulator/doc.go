// Package simulator drives a fleet of MQTT devices against a gateway on
// this machine and checks, from what a subscriber received, that every
// device stayed within its quota.
//
// The package has two halves. Check is pure and deterministic: given,
// per device, the quota, every message sent (with what its PUBACK said)
// and every arrival at the subscriber, it sorts each sent message into
// exactly one bucket, and measures latencies and the largest number of
// arrivals in any window of T:
//
//	sent = accepted + refused + deferred + lost + unacked
//	deferred = released + pending
//
// The buckets:
//
//   - accepted: PUBACK success, arrived (promptly, under policy defer);
//   - refused: PUBACK 0x80 or above (0x97); if it arrived anyway it is
//     also counted as leaked, a fault;
//   - deferred: policy defer only, PUBACK success (the gateway acks a
//     deferred message like an admitted one) and arrived later than
//     CheckOptions.Immediate (released) or not by the end (pending);
//   - lost: PUBACK success under drop or disconnect, never arrived; a
//     fault;
//   - unacked: no PUBACK (QoS 0, MQTT 3.1.1, or the connection ended),
//     arrived or not; not a fault, since nothing was promised.
//
// Duplicated deliveries and phantom arrivals (sequence numbers never
// sent) are counted besides. The window check counts first arrivals
// only, in half-open windows of T - Tolerance: a window holding more
// than the limit is excess. It is a violation when the device's own
// send and ack times confirm it (the gateway decides between the send
// and the earlier of ack and arrival, so admissions whose spans fit in
// T were admitted within T however late they arrived), or when the
// device had deferred messages released, which those times cannot
// place. Decide turns a Result into an exit
// decision: OK when no device is over quota and none lost, leaked or
// invented a message.
//
// Run is the fleet runner: it connects Config.Devices publishers
// (paho.golang for MQTT 5, paho.mqtt.golang for 3.1.1) and one MQTT 5
// subscriber, publishes payloads that start with a Header (device, seq,
// send time), waits a drain period for messages in flight, and checks.
// It refuses any target that is not a loopback address. Config.Mix
// gives classes of devices their own quota (ParseMix reads
// "70%:50/10s:drop,30%:5/1s:defer"); each device is judged against its
// own. Faults inject a reconnect storm and a gateway restart through a
// callback: devices are held back while the gateway is down, and after
// a crash each device's DeviceLog.Allowance is the excess the
// persistence bound allows. Report.WriteSummary writes a text table,
// Report.WriteHTML a self-contained page with SVG charts; Result.Timeline
// holds the fleet's messages over time by outcome.
//
// Config.Addrs spreads a fleet over several gateways as device SDKs do
// (a list of addresses, the next one on failure), Config.SubAddrs counts
// arrivals at each, and Config.Failover moves a device whose connection
// is lost (Report.Failovers). Starting gateways (embedded, as child
// processes, a fleet of them) is package fleet's business.
package simulator
