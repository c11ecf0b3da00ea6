package admin

import "github.com/devicegate/devicegate/devicelimit"

// Windows is where the admin API reads and empties device windows:
// Options.Table by default, or windows shared by several gateways.
type Windows interface {
	// PeekAllAt returns the verdict a message of size bytes at now
	// would get on the device's windows ls of topic class class ("" for
	// its own quota), without counting it; an error when the windows
	// cannot be read (shared windows while Redis does not answer).
	PeekAllAt(device, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) (devicelimit.Verdict, error)
	// Reset empties the device's windows and reports whether it had one.
	Reset(device string) (bool, error)
}

type tableWindows struct{ t *devicelimit.Table }

func (w tableWindows) PeekAllAt(device, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) (devicelimit.Verdict, error) {
	return w.t.PeekAllAt(device, class, ls, size, now), nil
}

func (w tableWindows) Reset(device string) (bool, error) { return w.t.Reset(device), nil }

// windows returns Options.Windows, or the table's.
func (s *Server) windows() Windows {
	if s.opts.Windows != nil {
		return s.opts.Windows
	}
	return tableWindows{s.opts.Table}
}
