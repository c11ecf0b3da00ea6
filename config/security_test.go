package config

import (
	"strings"
	"testing"
	"time"
)

func TestSecurityKeys(t *testing.T) {
	full := `
mqtt:
  tcp: ""
  tls: {addr: "127.0.0.1:8883", cert_file: c.pem, key_file: k.pem, client_ca_file: ca.pem}
  websocket: {addr: "127.0.0.1:8083", tls: true}
  max_packet_size: 1MiB
  max_client_id_length: 64
  max_connections: 10
  max_pending_writes: 100
  consumers: {client_ids: ["backend-*", "archiver"], write_buffer: 8MiB}
  connect_rate: {limit: 5, window: 10s, exempt: ["10.0.0.0/8"]}
  keepalive: {min: 5s, max: 10m}
admin: {tls: {cert_file: a.pem, key_file: b.pem}}
limits: {max_devices: 7}
auth:
  credentials_file: creds
  certificate_identity: dns
  acl: {publish: "fleet/{device}/up/#", subscribe: "fleet/{device}/down/+"}
`
	c, err := load(full)
	if err != nil {
		t.Fatal(err)
	}
	if c.AllowAll() || c.MQTT.TLS.ClientCAFile != "ca.pem" || c.MQTT.MaxPacketSize != 1<<20 || c.MQTT.MaxPendingWrites != 100 ||
		len(c.MQTT.Consumers.ClientIDs) != 2 || c.MQTT.Consumers.WriteBuffer != 8<<20 || c.Limits.MaxDevices != 7 ||
		c.ConnectRate().Window != 10*time.Second || c.Auth.ACL.Subscribe != "fleet/{device}/down/+" || !c.MQTT.WebSocket.TLS {
		t.Fatalf("parsed %+v", c)
	}
	roundTrip(t, c)
	if off, err := load(`mqtt: {connect_rate: {limit: 0, window: 0s}}`); err != nil || off.ConnectRate().Limit != 0 {
		t.Fatalf("connect_rate limit 0: %v, %v; want off", err, off.ConnectRate())
	}
	if c, err := load(`mqtt: {topic_alias_maximum: 0}`); err != nil || c.MQTT.TopicAliasMaximum != 0 || Default().MQTT.TopicAliasMaximum != 10 {
		t.Fatalf("topic_alias_maximum 0: %v, %d; default %d", err, c.MQTT.TopicAliasMaximum, Default().MQTT.TopicAliasMaximum)
	}
	if !Default().AllowAll() {
		t.Fatal("the default is not allow-all")
	}

	for _, tc := range []struct{ yaml, want string }{
		{`mqtt: {tcp: ""}`, `mqtt.tcp: must be host:port such as ":1883" when neither`},
		{`mqtt: {tls: {addr: ":8883"}}`, `mqtt.tls.cert_file: must name`},
		{`mqtt: {tls: {client_ca_file: ca.pem}}`, `mqtt.tls.client_ca_file: client certificates need a TLS listener`},
		{`mqtt: {websocket: {tls: true, addr: ":1"}}`, `mqtt.tls.key_file: must name`},
		{`mqtt: {max_packet_size: 10}`, `mqtt.max_packet_size: must be between 64B and 256MiB (got 10B)`},
		{`mqtt: {max_pending_writes: 0}`, `mqtt.max_pending_writes: must be between 1 and 1048576 (got 0)`},
		{`mqtt: {max_pending_per_address: 0}`, `mqtt.max_pending_per_address: must be at least 1 (got 0)`},
		{`mqtt: {topic_alias_maximum: 65536}`, `mqtt.topic_alias_maximum: must be between 0 and 65535, 0 for none (got 65536)`},
		{`mqtt: {topic_alias_maximum: -1}`, `mqtt.topic_alias_maximum: must be between 0 and 65535, 0 for none (got -1)`},
		{`mqtt: {consumers: {write_buffer: 1KiB}}`, `mqtt.consumers.write_buffer: must be between 64KiB and 1GiB (got 1KiB)`},
		{`mqtt: {consumers: {client_ids: ["ok-*", ""]}}`, `mqtt.consumers.client_ids[1]: invalid pattern: empty`},
		{`mqtt: {consumers: {clients: ["a"]}}`, `mqtt.consumers.clients: unknown key; expected one of client_ids, write_buffer`},
		{`mqtt: {max_client_id_length: 0}`, `mqtt.max_client_id_length: must be between 1 and 65535 (got 0)`},
		{`mqtt: {connect_rate: {limit: -1}}`, `mqtt.connect_rate.limit: must be between 1 and`},
		{`mqtt: {connect_rate: {window: 0s}}`, `mqtt.connect_rate.window: must be > 0`},
		{`mqtt: {connect_rate: {exempt: ["10.0.0.0/33"]}}`, `mqtt.connect_rate.exempt[0]: must be an address prefix`},
		{`mqtt: {keepalive: {min: 1500ms}}`, `mqtt.keepalive.min: must be whole seconds`},
		{`mqtt: {keepalive: {min: 2h}}`, `mqtt.keepalive.min: must be at most mqtt.keepalive.max, 1h0m0s (got "2h0m0s")`},
		{`limits: {max_devices: -1}`, `limits.max_devices: must be >= 0`},
		{`admin: {tls: {cert_file: a}}`, `admin.tls: needs both cert_file and key_file`},
		{`auth: {certificate_identity: ou}`, `auth.certificate_identity: must be cn, dns, email or uri (got "ou")`},
		{`auth: {acl: {publish: "devices/#"}}`, `auth.acl.publish: "devices/#": must contain {device}`},
		{`auth: {acl: {subscribe: "a/#/{device}"}}`, `auth.acl.subscribe: "a/#/{device}": '#' must be the last level`},
		{`auth: {password: x}`, `auth.password: unknown key; expected one of credentials_file, certificate_identity, acl`},
	} {
		_, err := load(tc.yaml)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.yaml, err, tc.want)
		}
	}
}
