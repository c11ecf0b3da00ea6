package admin

import "devicegate/devicelimit"

// Windows is where the admin API reads and empties device windows:
// Options.Table by default, or windows shared by several gateways.
type Windows interface {
	// PeekAt returns the decision a publish at now would get, without
	// counting it; an error when the window cannot be read (shared
	// windows while Redis does not answer).
	PeekAt(device string, q devicelimit.Quota, now devicelimit.Tick) (devicelimit.Decision, error)
	// Reset empties the device's window and reports whether it had one.
	Reset(device string) (bool, error)
}

type tableWindows struct{ t *devicelimit.Table }

func (w tableWindows) PeekAt(device string, q devicelimit.Quota, now devicelimit.Tick) (devicelimit.Decision, error) {
	return w.t.PeekAt(device, q, now), nil
}

func (w tableWindows) Reset(device string) (bool, error) { return w.t.Reset(device), nil }

// windows returns Options.Windows, or the table's.
func (s *Server) windows() Windows {
	if s.opts.Windows != nil {
		return s.opts.Windows
	}
	return tableWindows{s.opts.Table}
}
