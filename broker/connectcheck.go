package broker

import (
	"fmt"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// CONNECT flags (MQTT 3.1.1 and 5, 3.1.2.3).
const (
	flagReserved   = 0x01
	flagWill       = 0x04
	flagWillQoS    = 0x18
	flagWillRetain = 0x20
	flagPassword   = 0x40
	flagUsername   = 0x80
)

// connectFault is a CONNECT the specification forbids that mochi
// v2.7.9 answers wrongly: the reason, and the MQTT 5 CONNACK reason code
// (0: none, the connection is just closed). An MQTT 3.1.1 (or 3.1)
// client never gets a CONNACK for one, except rc3, when set: a 3.1.1
// CONNACK return code.
type connectFault struct {
	reason string
	v5     byte
	rc3    byte
}

// checkConnect judges a decoded CONNECT before mochi validates it. mochi
// answers an MQTT 3.1.1 client's malformed CONNECT with CONNACK 0x82,
// which 3.1.1 does not define (its return codes are 0 to 5; a malformed
// CONNECT closes the connection, [MQTT-3.1.4-1]), answers a protocol
// level it does not know in MQTT 5's format, answers a reserved flag bit
// with 0x82 where MQTT 5 says 0x81 malformed packet, and accepts a will
// QoS without a will and, in 3.1.1, a password without a user name.
func checkConnect(pk *packets.Packet) *connectFault {
	name, level := string(pk.Connect.ProtocolName), pk.ProtocolVersion
	flags := pk.ReservedBit
	if pk.Connect.Clean {
		flags |= 0x02
	}
	if pk.Connect.WillFlag {
		flags |= flagWill
	}
	flags |= pk.Connect.WillQos << 3
	if pk.Connect.WillRetain {
		flags |= flagWillRetain
	}
	if pk.Connect.PasswordFlag {
		flags |= flagPassword
	}
	if pk.Connect.UsernameFlag {
		flags |= flagUsername
	}
	switch {
	case name == "MQTT" && level != 4 && level != 5, name == "MQIsdp" && level != 3:
		// [MQTT-3.1.2-2]: return code 1, unacceptable protocol level, in
		// the format every level's client can read.
		return &connectFault{reason: fmt.Sprintf("unsupported protocol level %d", level), rc3: 1}
	case name != "MQTT" && name != "MQIsdp":
		return &connectFault{reason: fmt.Sprintf("protocol name %q is not MQTT", name), v5: 0x84} // [MQTT-3.1.2-1]
	case flags&flagReserved != 0:
		return &connectFault{reason: "reserved connect flag set", v5: 0x81} // [MQTT-3.1.2-3]
	case flags&flagWill == 0 && flags&(flagWillQoS|flagWillRetain) != 0:
		return &connectFault{reason: "will QoS or will retain without a will", v5: 0x81} // 3.1.1 [MQTT-3.1.2-13] [MQTT-3.1.2-15]; 5 [MQTT-3.1.2-11] [MQTT-3.1.2-13]
	case flags&flagWillQoS == flagWillQoS:
		return &connectFault{reason: "will QoS 3", v5: 0x81} // [MQTT-3.1.2-14] (5: [MQTT-3.1.2-12])
	case level < 5 && flags&flagPassword != 0 && flags&flagUsername == 0:
		return &connectFault{reason: "password without a user name"} // 3.1.1 [MQTT-3.1.2-22]
	case level < 5 && !pk.Connect.Clean && pk.Connect.ClientIdentifier == "":
		return &connectFault{reason: "empty client ID without clean session", rc3: 2} // 3.1.1 [MQTT-3.1.3-8]: identifier rejected
	case level < 5:
		if code := pk.ConnectValidate(); code != packets.CodeSuccess {
			if _, ok := packets.V5CodesToV3[code]; !ok {
				// mochi would answer with code, no 3.1.1 return code.
				return &connectFault{reason: code.Reason}
			}
		}
	}
	return nil
}

// refuseConnect answers a CONNECT checkConnect faulted: a CONNACK when
// the specification gives one, else nothing; the error it returns fails
// mochi's read of the CONNECT, and mochi closes the connection. It is counted as a CONNECT
// refused for a protocol error.
func (h *authHook) refuseConnect(cl *mqtt.Client, pk *packets.Packet, f *connectFault) error {
	h.protocolRefused(cl.Net.Remote, true, f.reason)
	switch {
	case f.rc3 != 0:
		_, _ = cl.Net.Conn.Write([]byte{0x20, 2, 0, f.rc3})
	case pk.ProtocolVersion == 5 && f.v5 != 0:
		_, _ = cl.Net.Conn.Write(refusalPacket(true, f.v5, f.reason, pk.Properties.MaximumPacketSize))
	}
	return packets.ErrRejectPacket // the one error OnPacketRead's callers do not ignore
}
