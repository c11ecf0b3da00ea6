package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/devicelimit"
)

// standingMainLua reads, without writing anything, the standing of the
// windows in KEYS (devicelimit.Table.StandingAt's, on Redis's clock):
// ARGV as windowLua's, six values per key, of which it uses the limit,
// T, B and the units, which are those of a refused message (0 when the
// message was admitted). It returns two integers per key: r, how many
// more units the window admits now, and t in microseconds: the retry-
// after of the refused message when the window is too full for it,
// else until its oldest count expires (0 for an empty window); r is -1
// when the key holds something else than a window record.
const standingMainLua = `
local out = {}
for k = 1, nk do
  local a = 6 * k
  local limit, units = tonumber(ARGV[a - 5]), tonumber(ARGV[a - 1])
  local st = prepare(KEYS[k], limit, tonumber(ARGV[a - 4]), tonumber(ARGV[a - 3]), 0, clock)
  if st == nil then
    out[2 * k - 1], out[2 * k] = -1, 0
  else
    use(st)
    local r = limit - st.total
    if r < 0 then r = 0 end
    local t = 0
    if units > 0 and units <= limit and st.total + units > limit then
      st.units = units
      t = retryOf(st) - st.now
    elseif st.total > 0 then
      -- The oldest bucket holding a count: retryOf for one unit over
      -- a limit of the total.
      st.units, st.limit = 1, st.total
      t = retryOf(st) - st.now
    end
    if t < 0 then t = 0 end
    out[2 * k - 1], out[2 * k] = r, t
  end
end
return out
`

var standingScript = redis.NewScript(windowFuncsLua + standingMainLua)

// StandingAt fills s with the standing of the shared windows that bound
// a message of size bytes of device in class under q and, when groupKey
// is not "", of its group's under gq: devicelimit.Table.StandingAt's
// contract, read in Redis on its clock. A look costs a round trip of
// its own. While Redis is unreachable it is read from the local table
// under PolicyLocal (which then decides), and s is left empty under
// the other policies: no standing rather than a wrong one.
func (l *Limiter) StandingAt(device, class string, q devicelimit.Quota, groupKey string, gq devicelimit.Quota, size int, refused bool, now devicelimit.Tick, s *devicelimit.Standing) {
	s.N = 0
	if l.health.skip() {
		l.localStanding(device, class, q, groupKey, gq, size, refused, now, s)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	if err := l.standingAt(ctx, device, class, q, groupKey, gq, size, refused, "", s); err != nil {
		l.health.failed(err)
		s.N = 0
		l.localStanding(device, class, q, groupKey, gq, size, refused, now, s)
	}
}

// localStanding is StandingAt while Redis is away.
func (l *Limiter) localStanding(device, class string, q devicelimit.Quota, groupKey string, gq devicelimit.Quota, size int, refused bool, now devicelimit.Tick, s *devicelimit.Standing) {
	if l.policy == PolicyLocal {
		l.local.StandingAt(device, class, q, groupKey, gq, size, refused, now, s)
	}
}

// standingAt reads the standing at clock (microseconds, or "" for
// Redis's TIME; see evalAllAt).
func (l *Limiter) standingAt(ctx context.Context, device, class string, q devicelimit.Quota, groupKey string, gq devicelimit.Quota, size int, refused bool, clock any, s *devicelimit.Standing) error {
	var r request
	ls, gls := q.Limits(), gq.Limits()
	if devicelimit.ValidateLimits(ls, l.buckets) != nil {
		return nil
	}
	if groupKey == "" || devicelimit.ValidateLimits(gls, l.buckets) != nil {
		gls = nil
	}
	units := 0
	if refused {
		units = max(size, 1) // a message window's units are 1 (fillPart)
	}
	l.fillPart(&r, l.windowKey(device), class, ls, units, false, 0)
	if gls != nil {
		l.fillPart(&r, l.windowKey(groupKey), "", gls, units, false, 0)
	}
	if !refused {
		for k := range r.n {
			r.args[6*k+4] = 0
		}
	}
	v, err := standingScript.Run(ctx, l.rdb, r.keys[:r.n], append(r.args[:6*r.n:6*r.n], clock)...).Int64Slice()
	if err != nil {
		return err
	}
	if len(v) != 2*r.n {
		return errBadReply
	}
	for k := range r.n {
		if v[2*k] < 0 {
			return fmt.Errorf("%w: %s", ErrBadWindow, r.keys[k])
		}
		w := devicelimit.WindowStanding{Class: class, Shadow: q.Shadow, Remaining: int(v[2*k]), Reset: time.Duration(v[2*k+1]) * time.Microsecond}
		if k < len(ls) {
			w.Limit = ls[k]
		} else {
			w.Class, w.Group, w.Shadow, w.Limit = "", true, gq.Shadow, gls[k-len(ls)]
		}
		s.Add(w)
	}
	s.Sort()
	return nil
}
