package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// MQTT 5 publishers (-v5): eclipse/paho.golang clients, QoS 1 only, so
// that a gateway's feedback user properties on PUBACK (RateLimit) are
// sent and read (docs/device-feedback.md). The subscribers stay MQTT
// 3.1.1.

// connect5 connects an MQTT 5 client with a clean start.
func connect5(addr, id string) (*paho.Client, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", id, err)
	}
	cl := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cl.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 60}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("connect %s: %w", id, err)
	}
	return cl, nil
}

// publish5 publishes at QoS 1 until deadline from c.inflight goroutines
// (each waits for its PUBACK, so at most c.inflight are unacknowledged),
// then sends the end marker and waits for its ack. Every ack's latency
// is recorded.
func publish5(cl *paho.Client, i int, c config, payload []byte, deadline time.Time, published *atomic.Int64, lat *[]time.Duration) error {
	topic := "bench/" + strconv.Itoa(i)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	send := func(t string) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		at := time.Now()
		resp, err := cl.Publish(ctx, &paho.Publish{Topic: t, QoS: 1, Payload: payload})
		if err != nil && (resp == nil || resp.ReasonCode < 0x80) {
			return 0, fmt.Errorf("publisher %d: ack: %w", i, err)
		}
		return time.Since(at), nil
	}
	for range c.inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(deadline) {
				d, err := send(topic)
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				mine = append(mine, d)
				published.Add(1)
			}
			mu.Lock()
			*lat = append(*lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	_, err := send(topic + "/end")
	return err
}
