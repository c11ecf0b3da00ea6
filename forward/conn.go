package forward

import "sync"

// Pending is an acknowledgement a destination completes once, with
// Finish: the Ack its Conn.Send returns.
type Pending struct {
	done chan struct{}
	err  error
}

// NewPending returns an acknowledgement not yet completed.
func NewPending() *Pending { return &Pending{done: make(chan struct{})} }

// Failed returns an acknowledgement that failed with err.
func Failed(err error) *Pending {
	p := NewPending()
	p.Finish(err)
	return p
}

// Finish completes the acknowledgement: the message is the
// destination's (err nil) or not. Call it once.
func (p *Pending) Finish(err error) { p.err = err; close(p.done) }

func (p *Pending) Done() <-chan struct{} { return p.done }
func (p *Pending) Error() error          { return p.err }

// Ending is the end of a destination connection: embedded in a Conn it
// provides Lost; End closes it, once, from anywhere.
type Ending struct {
	once sync.Once
	ch   chan struct{}
}

// NewEnding returns an Ending not yet ended.
func NewEnding() *Ending { return &Ending{ch: make(chan struct{})} }

// End closes Lost; later calls do nothing.
func (e *Ending) End() { e.once.Do(func() { close(e.ch) }) }

// Lost is closed once the connection ended.
func (e *Ending) Lost() <-chan struct{} { return e.ch }
