// Command loadgen is the load generator of `make bench-e2e`: one round
// of publishers and subscribers (eclipse/paho.mqtt.golang, MQTT 3.1.1)
// against one broker, then one JSON line with what it measured.
//
//	loadgen -addr 127.0.0.1:1883 -qos 1 -publishers 50 -subscribers 5 -duration 3s
//
// Publisher i publishes 64-byte payloads to bench/i as fast as the
// broker takes them (QoS 1: up to -inflight unacknowledged each; QoS 0:
// as fast as the connection is written, with a QoS 1 sync message every
// 1000 that keeps at most 2000 queued). Subscriber k subscribes, with
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
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	paho5 "github.com/eclipse/paho.golang/paho"
	paho "github.com/eclipse/paho.mqtt.golang"
)

type config struct {
	addr, subAddr           string
	qos                     byte
	publishers, subscribers int
	hot                     int
	inflight                int
	payload                 int
	duration, quiet         time.Duration
	v5                      bool // MQTT 5 publishers (v5.go)
	waitSignal              bool // publish only on SIGUSR1, once connected
}

// Result is the JSON line loadgen prints.
type Result struct {
	Published   int64   `json:"published"`
	ReceivedPS  float64 `json:"received_per_s"`
	Delivered   int64   `json:"delivered"`
	DeliveredPS float64 `json:"delivered_per_s"`
	Seconds     float64 `json:"seconds"`
	// AckP50 and AckP99 are the QoS 1 acknowledgement latencies in
	// milliseconds (publish to PUBACK), over every publish.
	AckP50 float64 `json:"ack_p50_ms,omitempty"`
	AckP99 float64 `json:"ack_p99_ms,omitempty"`
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
	fs.StringVar(&c.subAddr, "sub-addr", "", "the subscribers' broker `address` (default -addr): an upstream the broker forwards to")
	fs.UintVar(&qos, "qos", 0, "QoS of publishes and subscriptions, 0 or 1")
	fs.IntVar(&c.publishers, "publishers", 50, "publishing clients")
	fs.IntVar(&c.subscribers, "subscribers", 5, "subscribing clients (0: none, nothing delivered is measured)")
	fs.IntVar(&c.hot, "hot", 0, "how many publishers are named hot-i instead of pub-i")
	fs.IntVar(&c.inflight, "inflight", 32, "unacknowledged QoS 1 publishes per publisher")
	fs.IntVar(&c.payload, "payload", 64, "payload `bytes`")
	fs.DurationVar(&c.duration, "duration", 3*time.Second, "how long to publish")
	fs.DurationVar(&c.quiet, "quiet", 300*time.Millisecond, "end the round when no message has arrived for this long")
	fs.BoolVar(&c.v5, "v5", false, "MQTT 5 publishers (eclipse/paho.golang), QoS 1 only")
	fs.BoolVar(&c.waitSignal, "wait-signal", false, "once every client is connected, say so on stderr and publish only on SIGUSR1 (bench/instructions.sh counts only the load)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if qos > 1 || c.publishers < 1 || c.subscribers < 0 || c.inflight < 1 || c.hot > c.publishers || c.v5 && qos != 1 {
		return errors.New("need qos 0 or 1 (1 with -v5), publishers and inflight >= 1, subscribers >= 0, hot <= publishers")
	}
	if c.subAddr == "" {
		c.subAddr = c.addr
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
		cl, err := connect(c.subAddr, "sub-"+strconv.Itoa(k))
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
	pubs5 := make([]*paho5.Client, c.publishers)
	defer func() {
		for _, cl := range pubs5 {
			if cl != nil {
				_ = cl.Disconnect(&paho5.Disconnect{})
			}
		}
	}()
	for i := range pubs {
		id := "pub-" + strconv.Itoa(i)
		if i < c.hot {
			id = "hot-" + strconv.Itoa(i)
		}
		if c.v5 {
			cl, err := connect5(c.addr, id)
			if err != nil {
				return Result{}, err
			}
			pubs5[i] = cl
			continue
		}
		cl, err := connect(c.addr, id)
		if err != nil {
			return Result{}, err
		}
		clients = append(clients, cl)
		pubs[i] = cl
	}

	if c.waitSignal {
		start := make(chan os.Signal, 1)
		signal.Notify(start, syscall.SIGUSR1)
		fmt.Fprintln(os.Stderr, "loadgen: connected")
		<-start
		signal.Stop(start)
	}
	payload := make([]byte, c.payload)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	var published atomic.Int64
	lat := make([][]time.Duration, len(pubs)) // per publisher: QoS 1 ack latencies
	var wg sync.WaitGroup
	errs := make(chan error, len(pubs))
	start := time.Now()
	deadline := start.Add(c.duration)
	for i, cl := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send := func() error { return publish(cl, i, c, payload, deadline, &published, &lat[i]) }
			if c.v5 {
				send = func() error { return publish5(pubs5[i], i, c, payload, deadline, &published, &lat[i]) }
			}
			if err := send(); err != nil {
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
	for end := time.Now().Add(10 * time.Second); c.subscribers > 0 && time.Now().Before(end); {
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
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	if len(all) > 0 {
		slices.Sort(all)
		ms := func(q float64) float64 { return float64(all[int(q*float64(len(all)-1))]) / float64(time.Millisecond) }
		res.AckP50, res.AckP99 = ms(0.50), ms(0.99)
	}
	return res, nil
}

// qos0Sync bounds the QoS 0 messages of a publisher in flight; see
// publish.
const qos0Sync = 1000

// publish publishes until deadline, then sends the QoS 1 end marker and
// waits for every ack.
//
// A QoS 1 publish's latency is taken when it is the oldest in the
// window and its ack is waited for: the publisher is then blocked on it,
// so the time is the ack's, to within one Publish call.
func publish(cl paho.Client, i int, c config, payload []byte, deadline time.Time, published *atomic.Int64, lat *[]time.Duration) error {
	topic := "bench/" + strconv.Itoa(i)
	var window []paho.Token // unacknowledged QoS 1 publishes, oldest first
	var sentAt []time.Time  // when each was published
	wait := func(t paho.Token) error {
		if !t.WaitTimeout(60 * time.Second) {
			return fmt.Errorf("publisher %d: no ack within 60 s", i)
		}
		if t.Error() != nil {
			return fmt.Errorf("publisher %d: ack: %w", i, t.Error())
		}
		return nil
	}
	n := int64(0)
	var sync paho.Token // QoS 0: the last sync message, not yet waited for
	for ; n%64 != 0 || time.Now().Before(deadline); n++ {
		t := cl.Publish(topic, c.qos, false, payload)
		if c.qos == 0 {
			// Every qos0Sync messages a QoS 1 message to an unsubscribed
			// topic; wait for the one before: at most 2*qos0Sync
			// messages are queued in the connection, so the round does
			// not end with seconds of backlog in socket buffers.
			if (n+1)%qos0Sync == 0 {
				if sync != nil {
					if err := wait(sync); err != nil {
						return err
					}
				}
				sync = cl.Publish(topic+"/end", 1, false, payload)
			}
			continue
		}
		window = append(window, t)
		sentAt = append(sentAt, time.Now())
		if len(window) == c.inflight {
			if err := wait(window[0]); err != nil {
				return err
			}
			*lat = append(*lat, time.Since(sentAt[0]))
			window, sentAt = window[1:], sentAt[1:]
		}
	}
	if sync != nil {
		window = append(window, sync)
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
