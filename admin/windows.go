package admin

import (
	"errors"

	"github.com/devicegate/devicegate/devicelimit"
)

// ErrResetNotDurable, wrapped in Windows.Reset's error, says the
// device's windows were emptied (in memory, and in Redis when shared)
// but the data file does not hold that yet: the next snapshot writes
// it, and a crash before then can bring the old counts back.
var ErrResetNotDurable = errors.New("reset not yet in the data file")

// Windows is where the admin API reads and empties device windows:
// Options.Table by default, or windows shared by several gateways.
type Windows interface {
	// PeekAllAt returns the verdict a message of size bytes at now
	// would get on the device's windows ls of topic class class ("" for
	// its own quota), without counting it; an error when the windows
	// cannot be read (shared windows while Redis does not answer).
	PeekAllAt(device, class string, ls []devicelimit.Limit, size int, now devicelimit.Tick) (devicelimit.Verdict, error)
	// Reset empties the device's windows and reports whether it had
	// one; once it returns nil, a crash does not bring their counts
	// back. Its error wraps ErrResetNotDurable when the windows were
	// emptied all the same; otherwise nothing changed.
	Reset(device string) (bool, error)
}

// tableWindows are Options.Table's, when the gateway gives no Windows:
// a reset there is in memory only (a table without a data file).
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
