package forward

import "sync"

// deleter removes what the upstream acknowledged from the log on a
// goroutine of its own, so that the connection keeps sending while a
// deletion is committed (an fsync); the acknowledgements that arrive
// meanwhile go in the next deletion together.
type deleter struct {
	f      *Forwarder
	mu     sync.Mutex
	seqs   []uint64
	bytes  int64
	kick   chan struct{} // something to delete
	idle   *sync.Cond    // signalled after each deletion
	busy   bool
	err    error
	failed chan error // the first deletion failure
	done   chan struct{}
}

func (f *Forwarder) startDeleter() *deleter {
	d := &deleter{f: f, kick: make(chan struct{}, 1), failed: make(chan error, 1), done: make(chan struct{})}
	d.idle = sync.NewCond(&d.mu)
	go d.run()
	return d
}

// add queues acknowledged messages for deletion.
func (d *deleter) add(seqs []uint64, bytes int64) {
	if len(seqs) == 0 {
		return
	}
	d.mu.Lock()
	d.seqs = append(d.seqs, seqs...)
	d.bytes += bytes
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

func (d *deleter) run() {
	defer close(d.done)
	for range d.kick {
		d.mu.Lock()
		seqs, bytes := d.seqs, d.bytes
		d.seqs, d.bytes, d.busy = nil, 0, len(seqs) > 0
		d.mu.Unlock()
		var err error
		if len(seqs) > 0 {
			if err = d.f.remove(seqs, bytes); err == nil {
				d.f.forwarded.Add(uint64(len(seqs)))
			}
		}
		d.mu.Lock()
		d.busy = false
		if err != nil && d.err == nil {
			d.err = err
			d.failed <- err
		}
		d.idle.Broadcast()
		d.mu.Unlock()
	}
}

// flush waits until everything queued is deleted.
func (d *deleter) flush() error {
	select {
	case d.kick <- struct{}{}:
	default:
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for (len(d.seqs) > 0 || d.busy) && d.err == nil {
		d.idle.Wait()
	}
	return d.err
}

// stop deletes what is queued and ends the goroutine.
func (d *deleter) stop() error {
	err := d.flush()
	close(d.kick) // only the pump's goroutine sends on it
	<-d.done
	return err
}
