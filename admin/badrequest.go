package admin

import (
	"bytes"
	"net"
	"strconv"
)

// jsonBadRequests answers in JSON, like every other error of the API,
// the requests net/http refuses before any handler sees them: a path
// with an invalid percent-escape ("/api/v1/forward/%ZZ/dead"), a
// malformed request line or header. net/http writes a fixed plain-text
// 400 on the connection itself for those; the listener's connections
// write the JSON error instead of exactly that. Over TLS the plain text
// stays (the answer is written to the TLS connection, which cannot be
// wrapped without losing what net/http asks of it).
type jsonBadRequests struct{ net.Listener }

func (l jsonBadRequests) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return badRequestConn{c}, nil
}

// plainBadRequest is net/http's answer to a request it cannot read
// (net/http's server.go, "400 Bad Request").
var plainBadRequest = []byte("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request")

var jsonBadRequest = func() []byte {
	body := `{"error":"malformed request: a path with an invalid percent-escape (such as %ZZ), or a request line or header HTTP does not allow"}` + "\n"
	return []byte("HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

type badRequestConn struct{ net.Conn }

func (c badRequestConn) Write(b []byte) (int, error) {
	if bytes.Equal(b, plainBadRequest) {
		if _, err := c.Conn.Write(jsonBadRequest); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// CloseWrite half-closes a TCP connection, as net/http does before it
// closes one it answered with an error.
func (c badRequestConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
