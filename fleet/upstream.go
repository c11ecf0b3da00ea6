package fleet

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/devicegate/devicegate/config"
)

// simUpstream is the upstream broker of `simulate --upstream`: one the
// simulator starts in this process (embedded, a plain mochi broker) or
// one already running. The gateway the simulator starts forwards to it
// through a link the simulator can cut (--upstream-outage-at).
type simUpstream struct {
	addr string       // the broker's address: the subscriber counts arrivals there
	srv  *mqtt.Server // the embedded broker, or nil
	link *linkCutter  // between the gateway and the broker; nil for a gateway not started here
}

// startSimUpstream starts the upstream of spec ("embedded" or a
// loopback host:port) and, when own, the link the gateway goes through.
func startSimUpstream(spec string, own bool) (*simUpstream, error) {
	u := &simUpstream{addr: spec}
	if spec == "embedded" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("simulate: --upstream embedded: %w", err)
		}
		u.addr = l.Addr().String()
		u.srv = mqtt.New(&mqtt.Options{Logger: slog.New(slog.DiscardHandler), InlineClient: false})
		if err := errors.Join(u.srv.AddHook(new(auth.AllowHook), nil), u.srv.AddListener(listeners.NewNet("upstream", l))); err != nil {
			l.Close()
			return nil, fmt.Errorf("simulate: --upstream embedded: %w", err)
		}
		if err := u.srv.Serve(); err != nil {
			return nil, fmt.Errorf("simulate: --upstream embedded: %w", err)
		}
	}
	if own {
		var err error
		if u.link, err = newLinkCutter(u.addr); err != nil {
			u.close()
			return nil, fmt.Errorf("simulate: --upstream: %w", err)
		}
	}
	return u, nil
}

// forward is the forward: entry that sends everything the started
// gateway admits to the upstream, through the link.
func (u *simUpstream) forward() config.Forward {
	return config.Forward{Name: "simulator-upstream", To: "mqtt://" + u.link.addr(), Topics: []string{"#"}, MaxQoS: 1}
}

func (u *simUpstream) close() {
	if u.link != nil {
		u.link.close()
	}
	if u.srv != nil {
		_ = u.srv.Close()
	}
}

// linkCutter is a loopback TCP proxy to an upstream that can be cut:
// while down, its connections are closed and new ones closed on accept,
// as over a link that went away; up again, it relays.
type linkCutter struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newLinkCutter(target string) (*linkCutter, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &linkCutter{l: l, target: target, conns: map[net.Conn]bool{}}
	c.wg.Go(c.accept)
	return c, nil
}

func (c *linkCutter) addr() string { return c.l.Addr().String() }

func (c *linkCutter) accept() {
	for {
		in, err := c.l.Accept()
		if err != nil {
			return // closed
		}
		c.mu.Lock()
		if c.down {
			c.mu.Unlock()
			in.Close()
			continue
		}
		c.conns[in] = true
		c.mu.Unlock()
		c.wg.Go(func() { c.relay(in) })
	}
}

// relay copies between in and a new connection to the target until
// either ends or the link is cut.
func (c *linkCutter) relay(in net.Conn) {
	defer func() {
		c.mu.Lock()
		delete(c.conns, in)
		c.mu.Unlock()
		in.Close()
	}()
	out, err := net.Dial("tcp", c.target)
	if err != nil {
		return
	}
	c.mu.Lock()
	if c.down {
		c.mu.Unlock()
		out.Close()
		return
	}
	c.conns[out] = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.conns, out)
		c.mu.Unlock()
		out.Close()
	}()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
	go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
	<-done
	in.Close()
	out.Close()
	<-done
}

// set takes the link down (closing every connection) or up.
func (c *linkCutter) set(down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = down
	if down {
		for conn := range c.conns {
			conn.Close()
		}
	}
}

func (c *linkCutter) close() {
	c.l.Close()
	c.set(true)
	c.wg.Wait()
}
