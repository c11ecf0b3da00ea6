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
// provides Lost and Reason; End or EndWith closes it, once, from
// anywhere.
type Ending struct {
	once   sync.Once
	ch     chan struct{}
	reason error
}

// NewEnding returns an Ending not yet ended.
func NewEnding() *Ending { return &Ending{ch: make(chan struct{})} }

// End closes Lost; later calls do nothing.
func (e *Ending) End() { e.EndWith(nil) }

// EndWith closes Lost, giving why (the first call's reason stays).
func (e *Ending) EndWith(why error) {
	e.once.Do(func() {
		e.reason = why
		close(e.ch)
	})
}

// Lost is closed once the connection ended.
func (e *Ending) Lost() <-chan struct{} { return e.ch }

// Reason returns why the connection ended (EndWith's error), once Lost
// is closed; nil when no reason was given.
func (e *Ending) Reason() error {
	select {
	case <-e.ch:
		return e.reason
	default:
		return nil
	}
}
