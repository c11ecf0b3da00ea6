// Command loadgen is the load generator of `make bench-e2e`: one round
// of publishers and subscribers (eclipse/paho.mqtt.golang, MQTT 3.1.1)
// against one broker, then one JSON line with what it measured.
//
//	loadgen -addr 127.0.0.1:1883 -qos 1 -publishers 50 -subscribers 5 -duration 3s
//
// Publisher i publishes 64-byte payloads to bench/i as fast as the
// broker takes them (QoS 1: up to -inflight unacknowledged each; QoS 0:
// as fast as the connection is written). Subscriber k subscribes, with
// the same QoS, to the topics of publishers i with i mod subscribers ==
// k, so every message goes to one subscriber and no single subscriber
// carries all. The first -hot publishers are named hot-i, the others
// pub-i, for a gateway rule that throttles the hot ones.
//
// Received is what the broker has taken in: at the end every publisher
// sends one QoS 1 message to an unsubscribed topic, and the broker, which
// handles a connection's packets in order, acks it only after all before
// it; received/s is the published count over the time to the last such
// ack (QoS 1: to the last ack). Delivered/s is the count the subscribers
// got over the time to the last delivery; the round waits until no
// message has arrived for -quiet.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

type config struct {
	addr                    string
	qos                     byte
	publishers, subscribers int
	hot                     int
	inflight                int
	payload                 int
	duration, quiet         time.Duration
}

// Result is the JSON line loadgen prints.
type Result struct {
	Published   int64   `json:"published"`
	ReceivedPS  float64 `json:"received_per_s"`
	Delivered   int64   `json:"delivered"`
	DeliveredPS float64 `json:"delivered_per_s"`
	Seconds     float64 `json:"seconds"`
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var c config
	var qos uint
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:1883", "broker `address`")
	fs.UintVar(&qos, "qos", 0, "QoS of publishes and subscriptions, 0 or 1")
	fs.IntVar(&c.publishers, "publishers", 50, "publishing clients")
	fs.IntVar(&c.subscribers, "subscribers", 5, "subscribing clients")
	fs.IntVar(&c.hot, "hot", 0, "how many publishers are named hot-i instead of pub-i")
	fs.IntVar(&c.inflight, "inflight", 32, "unacknowledged QoS 1 publishes per publisher")
	fs.IntVar(&c.payload, "payload", 64, "payload `bytes`")
	fs.DurationVar(&c.duration, "duration", 3*time.Second, "how long to publish")
	fs.DurationVar(&c.quiet, "quiet", 300*time.Millisecond, "end the round when no message has arrived for this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if qos > 1 || c.publishers < 1 || c.subscribers < 1 || c.inflight < 1 || c.hot > c.publishers {
		return errors.New("need qos 0 or 1, publishers, subscribers and inflight >= 1, hot <= publishers")
	}
	c.qos = byte(qos)
	res, err := round(c)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

func connect(addr, id string) (paho.Client, error) {
	o := paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectRetry(false).
		SetKeepAlive(60 * time.Second).SetConnectTimeout(5 * time.Second)
	cl := paho.NewClient(o)
	if t := cl.Connect(); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return nil, fmt.Errorf("connect %s: %v", id, t.Error())
	}
	return cl, nil
}

func round(c config) (Result, error) {
	var delivered atomic.Int64
	var lastDelivery atomic.Int64 // unix ns
	onMsg := func(paho.Client, paho.Message) {
		delivered.Add(1)
		lastDelivery.Store(time.Now().UnixNano())
	}
	var clients []paho.Client
	defer func() {
		for _, cl := range clients {
			cl.Disconnect(0)
		}
	}()
	for k := range c.subscribers {
		cl, err := connect(c.addr, "sub-"+strconv.Itoa(k))
		if err != nil {
			return Result{}, err
		}
		clients = append(clients, cl)
		filters := map[string]byte{}
		for i := k; i < c.publishers; i += c.subscribers {
			filters["bench/"+strconv.Itoa(i)] = c.qos
		}
		if t := cl.SubscribeMultiple(filters, onMsg); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
			return Result{}, fmt.Errorf("subscribe: %v", t.Error())
		}
	}
	pubs := make([]paho.Client, c.publishers)
	for i := range pubs {
		id := "pub-" + strconv.Itoa(i)
		if i < c.hot {
			id = "hot-" + strconv.Itoa(i)
		}
		cl, err := connect(c.addr, id)
		if err != nil {
			return Result{}, err
		}
		clients = append(clients, cl)
		pubs[i] = cl
	}

	payload := make([]byte, c.payload)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	var published atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(pubs))
	start := time.Now()
	deadline := start.Add(c.duration)
	for i, cl := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := publish(cl, i, c, payload, deadline, &published); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	received := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return Result{}, err
	}
	// Wait for the deliveries to stop, at most 10 s.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		last := lastDelivery.Load()
		if last != 0 && time.Since(time.Unix(0, last)) > c.quiet || last == 0 && time.Since(start) > c.duration+c.quiet {
			break
		}
		time.Sleep(c.quiet / 10)
	}
	d := delivered.Load()
	res := Result{Published: published.Load(), Delivered: d, Seconds: received.Seconds()}
	res.ReceivedPS = float64(res.Published) / received.Seconds()
	if last := lastDelivery.Load(); last != 0 {
		res.DeliveredPS = float64(d) / time.Unix(0, last).Sub(start).Seconds()
	}
	return res, nil
}

// publish publishes until deadline, then sends the QoS 1 end marker and
// waits for every ack.
func publish(cl paho.Client, i int, c config, payload []byte, deadline time.Time, published *atomic.Int64) error {
	topic := "bench/" + strconv.Itoa(i)
	var window []paho.Token // unacknowledged QoS 1 publishes, oldest first
	wait := func(t paho.Token) error {
		if !t.WaitTimeout(30*time.Second) || t.Error() != nil {
			return fmt.Errorf("publisher %d: ack: %v", i, t.Error())
		}
		return nil
	}
	n := int64(0)
	for ; n%64 != 0 || time.Now().Before(deadline); n++ {
		t := cl.Publish(topic, c.qos, false, payload)
		if c.qos == 0 {
			continue
		}
		window = append(window, t)
		if len(window) == c.inflight {
			if err := wait(window[0]); err != nil {
				return err
			}
			window = window[1:]
		}
	}
	window = append(window, cl.Publish(topic+"/end", 1, false, payload))
	for _, t := range window {
		if err := wait(t); err != nil {
			return err
		}
	}
	published.Add(n)
	return nil
}
