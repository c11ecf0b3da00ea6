package simulator

import (
	"sort"
	"sync"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// Report is the outcome of a run. Every field has a JSON name, so the
// report can be written with encoding/json as is.
type Report struct {
	Config   Config    `json:"config"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// ConnectFailures counts devices that never connected;
	// Disconnects counts device connections that ended before the run
	// did (policy disconnect, or a fault).
	ConnectFailures int `json:"connect_failures"`
	Disconnects     int `json:"disconnects"`
	// RefusedAtConnect counts the connect failures that were the
	// gateway refusing the device for who it is (bad username or
	// password, client ID not allowed, not authorized; see Auth): they
	// fail the run.
	RefusedAtConnect int `json:"refused_at_connect"`
	// Blocked are the devices the gateway blocked (automatic blocking:
	// DISCONNECT 0x98, or CONNACK 0x8A): they stop publishing; not a
	// fault of the run.
	Blocked []string `json:"blocked,omitempty"`
	// SubscriberLost is true when the subscriber's connection ended
	// before the run did: arrivals after that were not seen, so lost
	// counts are not to be trusted.
	SubscriberLost bool `json:"subscriber_lost"`
	// BadPayloads counts arrivals on the topic filter that do not start
	// with a Header: another publisher shares the topics.
	BadPayloads int `json:"bad_payloads"`
	// Reconnects counts device connections made again after a
	// reconnect storm or a gateway restart.
	Reconnects int `json:"reconnects"`
	// Failovers are, per connection lost under Config.Failover, the
	// time until the device had a message admitted again, ascending.
	Failovers FailoverTimes `json:"failovers_ns,omitempty"`
	// Readmitted are the instants of those messages admitted again,
	// ascending: against the time a gateway was killed, how soon its
	// devices were served elsewhere.
	Readmitted []time.Time `json:"readmitted,omitempty"`
	// AllConnected is how long after the start every device was
	// connected at once; 0 when that never happened.
	AllConnected time.Duration `json:"all_connected_ns,omitempty"`
	// Puback holds the PUBACK latencies (send to PUBACK) of every
	// message that had one.
	Puback Latency `json:"puback"`
	// PubackConnected is Puback over the messages sent once every
	// device was connected (AllConnected): without the connection
	// storm's; zero when that never happened.
	PubackConnected Latency `json:"puback_connected,omitzero"`
	// Connect holds the latencies of the devices' first connections
	// (dial to CONNACK, the attempt that succeeded).
	Connect Latency `json:"connect"`
	// Restarts lists the gateway restarts of the run.
	Restarts []RestartEvent `json:"restarts,omitempty"`
	// Availability is, per restart, how soon the devices were admitted
	// again and the quota the restart took from them.
	Availability []RestartAvailability `json:"availability,omitempty"`
	// Outages lists the upstream link's outages of the run.
	Outages []OutageEvent `json:"upstream_outages,omitempty"`
	// Errors holds the first few distinct error messages seen.
	Errors []string `json:"errors,omitempty"`
	Result Result   `json:"result"`
	// Clients sums the run per client of Config.Client (clientreport.go).
	Clients []ClientResult `json:"clients,omitempty"`
	// Simulator is what this process used during the run (resources.go).
	Simulator Resources `json:"simulator"`
	// Verdict is Decide's on Result, and not OK when SubscriberLost.
	Verdict Verdict `json:"verdict"`
}

// maxErrors bounds Report.Errors.
const maxErrors = 10

// recorder collects observations from every goroutine of a run. Safe
// for concurrent use.
type recorder struct {
	mu          sync.Mutex
	logs        map[string]*DeviceLog
	connFails   int
	connRefused int // connect failures that were ErrConnectRefused
	disconnects int
	blocked     map[string]bool
	errs        []string
	// seen tracks, per device and seq, a success ack not yet matched by
	// an arrival (true) or an arrival not yet matched by its ack
	// (false): the ack and the arrival race.
	seen        map[seqKey]bool
	outstanding int  // success-acked messages not yet arrived
	blind       bool // some message had no ack: drain runs in full
	badPayloads int
	subLost     bool
	closing     bool // the subscriber is being closed on purpose
	restarting  bool // the gateway is restarting: losing the subscriber is expected
	reconnects  int
	failovers   []time.Duration
	readmitted  []time.Time
	// allConnected is when every device was first connected at once.
	allConnected time.Time
	// connects are the first connections' dial-to-CONNACK latencies.
	connects []time.Duration

	// For progress: live counters, and the devices over quota so far
	// by a quick check of each arrival against the ones before it.
	quotas    map[string]devicelimit.Quota
	tolerance time.Duration
	classes   []TopicClass
	connected int
	nSent     int
	nRefused  int
	nArrived  int
	over      map[string]bool
}

func newRecorder(cfg Config) *recorder {
	r := &recorder{
		logs:      make(map[string]*DeviceLog, cfg.Devices),
		seen:      make(map[seqKey]bool),
		quotas:    make(map[string]devicelimit.Quota, cfg.Devices),
		tolerance: cfg.Tolerance,
		classes:   cfg.TopicClasses,
		over:      make(map[string]bool),
	}
	// Every device has a log, so that one that never got to send is
	// in the report too.
	for i := range cfg.Devices {
		id := cfg.DeviceID(i)
		r.quotas[id] = cfg.QuotaOf(i)
		r.logs[id] = &DeviceLog{Device: id}
	}
	return r
}

type seqKey struct {
	dev string
	seq uint64
}

func (r *recorder) log(dev string) *DeviceLog {
	l := r.logs[dev]
	if l == nil {
		l = &DeviceLog{Device: dev}
		r.logs[dev] = l
	}
	return l
}

func (r *recorder) sent(dev string, s Sent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.log(dev)
	l.Sent = append(l.Sent, s)
	r.nSent++
	if s.Ack == AckRefused {
		r.nRefused++
	}
	k := seqKey{dev, s.Seq}
	v, ok := r.seen[k]
	switch {
	case s.Ack == AckNone:
		r.blind = true
		delete(r.seen, k)
	case ok && !v:
		delete(r.seen, k) // arrived before its ack
	case s.Ack == AckSuccess:
		r.seen[k] = true
		r.outstanding++
	}
}

func (r *recorder) arrival(dev string, a Arrival) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.log(dev)
	l.Arrivals = append(l.Arrivals, a)
	r.nArrived++
	if q, ok := r.quotas[dev]; ok && !r.over[dev] && q.NWindows == 0 && len(r.classes) == 0 {
		// Arrivals come in time order from the one subscriber: the
		// ones within T - tolerance before this one are a suffix.
		// (The progress line's count; with several windows or topic
		// classes only the checker judges.)
		from := a.At.Add(-(q.Window - r.tolerance))
		k := sort.Search(len(l.Arrivals), func(i int) bool { return l.Arrivals[i].At.After(from) })
		if len(l.Arrivals)-k > q.Limit {
			r.over[dev] = true
		}
	}
	k := seqKey{dev, a.Seq}
	v, ok := r.seen[k]
	switch {
	case ok && v:
		delete(r.seen, k)
		r.outstanding--
	case !ok && !r.acked(dev, a.Seq):
		r.seen[k] = false
	}
}

func (r *recorder) fail(err error, connect bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if connect {
		r.connFails++
	} else {
		r.disconnects++
	}
	r.note(err)
}

// blockedDevice records a device the gateway blocked.
func (r *recorder) blockedDevice(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.blocked == nil {
		r.blocked = map[string]bool{}
	}
	r.blocked[id] = true
}

// refusedAtConnect counts a device the gateway refused at CONNECT
// for its credentials or client ID.
func (r *recorder) refusedAtConnect() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.connRefused++
}

// connection counts a device connection made (+1) or ended (-1);
// again marks a reconnection.
func (r *recorder) connection(delta int, again bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.connected += delta
	if r.connected == len(r.logs) && r.allConnected.IsZero() {
		r.allConnected = time.Now()
	}
	if again {
		r.reconnects++
	}
}

// connectTook records how long a device's first connection took.
func (r *recorder) connectTook(d time.Duration) {
	r.mu.Lock()
	r.connects = append(r.connects, d)
	r.mu.Unlock()
}

func (r *recorder) setRestarting(v bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restarting = v
}

// Progress is a run's state while devices publish, for a live display.
type Progress struct {
	Elapsed   time.Duration
	Connected int
	// Sent, Refused and Arrived count since the start of the run.
	Sent, Refused, Arrived int
	// Over is the number of devices seen over quota so far by a quick
	// check of each arrival (the final verdict is Check's).
	Over int
}

func (r *recorder) progress() Progress {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Progress{Connected: r.connected, Sent: r.nSent, Refused: r.nRefused, Arrived: r.nArrived, Over: len(r.over)}
}

// badPayload records an arrival that is not a simulator message.
func (r *recorder) badPayload(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.badPayloads++
	r.note(err)
}

// note keeps err's message among the first few distinct ones.
func (r *recorder) note(err error) {
	msg := err.Error()
	for _, e := range r.errs {
		if e == msg {
			return
		}
	}
	if len(r.errs) < maxErrors {
		r.errs = append(r.errs, msg)
	}
}

// acked reports whether dev's message seq has its outcome recorded;
// devices send in seq order, so that is seq < len(Sent).
func (r *recorder) acked(dev string, seq uint64) bool {
	return seq < uint64(len(r.logs[dev].Sent))
}

// drained reports whether every success-acked message has arrived and
// every message had an ack; a message without an ack may still come,
// so then only the drain period ends the wait.
func (r *recorder) drained() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.outstanding == 0 && !r.blind
}
