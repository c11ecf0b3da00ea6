package server

import (
	"net"
	"os"
)

// sdNotify sends state ("READY=1", "RELOADING=1", "STOPPING=1"...) to
// the service manager over the datagram socket $NOTIFY_SOCKET names, as
// systemd's sd_notify does (systemd's Type=notify; the protocol is one
// datagram of newline-separated KEY=VALUE lines). It does nothing
// without $NOTIFY_SOCKET. A name starting with '@' is an abstract
// socket. Only the main process may notify (NotifyAccess=main), so the
// variable is left for children to ignore.
func sdNotify(state string) error {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return nil
	}
	if name[0] == '@' {
		name = "\x00" + name[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte(state))
	return err
}
