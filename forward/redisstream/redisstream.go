// Package redisstream is the Redis Streams destination of a forward
// log: each message is added (XADD) to a stream named from its topic,
// with fields for its ID in the log (the same when sent again), the
// MQTT topic, the device, the acceptance time and the payload, optionally trimmed to about MaxLen entries (MAXLEN ~). Sends
// are pipelined: what is handed over while a round trip is under way
// goes in the next one, and a message counts as acknowledged once Redis
// answered its XADD. It implements forward.Dialer and forward.Conn.
package redisstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/forward"
)

// Dialer connects to one Redis.
type Dialer struct {
	// Options are the client's (from a redis:// URL).
	Options *redis.Options
	// Stream names a message's stream: "{topic}" and "{device}" are
	// replaced by its MQTT topic and device ("{topic}" when empty).
	Stream string
	// MaxLen, when > 0, trims each stream to about that many entries.
	MaxLen int64
}

// Addr names the destination in logs.
func (d *Dialer) Addr() string { return "redis://" + d.Options.Addr }

// Dial connects and checks that Redis answers.
func (d *Dialer) Dial(ctx context.Context) (forward.Conn, error) {
	c := redis.NewClient(d.Options)
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("connect to %s: %w", d.Addr(), err)
	}
	conn := &conn{d: d, c: c, stream: forward.ParseTemplate(d.Stream, "{topic}"), Ending: forward.NewEnding(), kick: make(chan struct{}, 1), done: make(chan struct{})}
	go conn.run()
	return conn, nil
}

// verbatim writes a field of a stream name as it is.
func verbatim(b []byte, s string, _ bool) []byte { return append(b, s...) }

var errClosed = errors.New("connection closed")

type conn struct {
	d      *Dialer
	stream forward.Template
	c      *redis.Client
	*forward.Ending

	mu      sync.Mutex
	pending []*sent
	closed  bool
	kick    chan struct{}
	done    chan struct{}
}

// sent is one message handed to Send, and its acknowledgement.
type sent struct {
	m   forward.Message
	ack *forward.Pending
}

func (c *conn) Send(m *forward.Message, _ byte) forward.Ack {
	s := &sent{m: *m, ack: forward.NewPending()}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return forward.Failed(errClosed)
	}
	c.pending = append(c.pending, s)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return s.ack
}

// run sends what is pending, a pipeline at a time, until Close or a
// failure (which ends the connection: the forwarder sends again from
// the log).
func (c *conn) run() {
	defer close(c.done)
	for range c.kick {
		c.mu.Lock()
		batch := c.pending
		c.pending = nil
		c.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		errs, err := c.send(batch)
		if err != nil {
			c.EndWith(err)
		}
		for i, s := range batch {
			s.ack.Finish(errs[i])
		}
		if c.isClosed() {
			return
		}
	}
}

// send sends batch in one pipeline and returns each XADD's outcome,
// and the connection's failure, if any (then every outcome not known
// is that failure). A command Redis answered with an error is that
// message's outcome alone: Redis ran the others (a pipeline is not a
// transaction).
func (c *conn) send(batch []*sent) ([]error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pipe := c.c.Pipeline()
	for _, s := range batch {
		args := &redis.XAddArgs{
			Stream: c.stream.Expand(s.m.Topic, s.m.Device, verbatim),
			Values: []any{"id", s.m.ID, "topic", s.m.Topic, "device", s.m.Device, "at", strconv.FormatInt(s.m.At.UnixMilli(), 10),
				"qos", strconv.Itoa(int(s.m.QoS)), "payload", s.m.Payload},
		}
		if c.d.MaxLen > 0 {
			args.MaxLen, args.Approx = c.d.MaxLen, true
		}
		pipe.XAdd(ctx, args)
	}
	cmds, err := pipe.Exec(ctx) // the first failed command's error, if any
	errs := make([]error, len(batch))
	var lost error
	for i := range batch {
		var cerr error
		if i < len(cmds) {
			cerr = cmds[i].Err()
		} else {
			cerr = err
		}
		if cerr == nil {
			continue
		}
		cerr = fmt.Errorf("XADD to %s: %w", c.d.Addr(), cerr)
		if reason, ok := refusal(cerr); ok {
			errs[i] = forward.Refuse(reason, cerr)
			continue
		}
		errs[i] = cerr
		if lost == nil {
			lost = cerr
		}
	}
	return errs, lost
}

// refusal tells a command Redis refused for good (sent again, it would
// be refused again) from a failure of the connection or of the moment
// (OOM, LOADING, BUSY, READONLY, TRYAGAIN...): WRONGTYPE (the stream's
// key holds another type), NOPERM (an ACL), and ERR (a command Redis
// cannot run, an ID or argument it does not take).
func refusal(err error) (reason string, ok bool) {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return "", false
	}
	msg := rerr.Error()
	switch {
	case strings.HasPrefix(msg, "WRONGTYPE"):
		return "wrong_type", true
	case strings.HasPrefix(msg, "NOPERM"):
		return "not_authorized", true
	case strings.HasPrefix(msg, "ERR"):
		return "refused", true
	}
	return "", false
}

func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Close ends the connection; what was not answered yet fails.
func (c *conn) Close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.kick)
	}
	rest := c.pending
	c.pending = nil
	c.mu.Unlock()
	<-c.done
	for _, s := range rest {
		s.ack.Finish(errClosed)
	}
	c.c.Close()
}
