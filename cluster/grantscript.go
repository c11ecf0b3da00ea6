package cluster

import "github.com/redis/go-redis/v9"

// grantMainLua claims a grant on a tenant group's windows for owner
// mode (ownergroup.go; docs/design.md, "Group grants"): a share of each
// window that the claiming gateway then admits locally until it is used
// up or its span ends.
//
// KEYS are the group's grant rings, one per window (all under the
// group's hash tag: one slot on Redis Cluster). ARGV[1] is an explicit
// time in microseconds that only tests pass (empty in production: Redis's
// TIME; 0 runs each ring at its own latest instant: a give-back at a
// gateway's stop, which must not move a ring's clock); then nine values
// per key: the limit N, the window length T
// in microseconds, the bucket count B (of a ring made afresh: an
// existing one keeps its own), the units wanted (-1: only look, nothing
// written), the units the message at hand needs (the grant is never
// less; 0 for a look), and a give-back of an earlier grant whose span
// has ended: its unused units, its dated bucket and its ring's T and B
// (0 units: none).
//
// A ring holds B+1+F counters, F = floor(B/4): the B+1 buckets of a
// window of T (as windowLua's) and F buckets after the current one,
// where grants usable beyond the current bucket are dated. A grant is
// dated in the last bucket it may be used in and is usable until that
// bucket ends; every claim counts every counter held, past and future.
// Why that keeps every interval of T within N is in docs/design.md
// ("Group grants", proof sketch). A claim is refused (nothing granted
// in any window) when one window has no room for the message; else each
// window grants at least the message's units and at most the units
// wanted and a quarter of its room, dated F buckets ahead while a
// quarter of N stays free after it, else in the current bucket (a span
// of at most one bucket: near N a grant is the per-message script's
// decision).
//
// A key after the rings' (one per nine values) is the group's window of
// the per-message script (w:{\0group}, the same hash tag): the reply
// then ends with 1 when it exists, which in owner mode means a gateway
// of an earlier build decided the group per message within the last
// window (ownergroup.go logs it).
//
// It returns seven integers per ring: units granted (0: refused; -1:
// the key holds something else, nothing written), the dated bucket, the
// instant the grant's span ends, the ring's now (microseconds), the
// ring's count after the claim, a time in microseconds from the ring's
// now, and the ring's B. The time is, for a window without room for
// the units needed (of a refused claim, or of a look given units), the
// retry-after of those units; else how long until the ring's oldest
// count leaves it (0: the ring holds nothing), which the gateway's
// standing of the group keeps (ownergroupstanding.go).
//
// The record is one string: head bucket, clock high-water, T, count
// (int64 each), B and F (uint32), then B+1+F int64 counters (a ring
// made afresh that holds nothing is not written). The key
// expires when its furthest bucket leaves the window, and no sooner
// than ten seconds after it was written.
const grantMainLua = `
local nk = (#ARGV - 1) / 9
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local HDR = '<i8i8i8i8I4I4'
local HDRLEN = 40

local function load(key, T, B)
  local rec = redis.pcall('GET', key)
  if type(rec) == 'table' then return nil end
  local r = {key = key, T = T, t = now, c = {}}
  if not rec then
    r.B = B; r.F = math.floor(B / 4); r.S = B + 1 + r.F
    r.head = bucketOf(now, B, T); r.total = 0; r.fresh = true
    for i = 0, r.S - 1 do r.c[i] = 0 end
    return r
  end
  if #rec < HDRLEN then return nil end
  local head, hw, T0, total, B0, F0 = struct.unpack(HDR, rec)
  local S0 = B0 + 1 + F0
  if B0 < 1 or T0 < 1 or #rec ~= HDRLEN + 8 * S0 then return nil end
  if hw > r.t then r.t = hw end
  if T0 == T then
    r.B, r.F, r.S, r.head, r.total = B0, F0, S0, head, total
    for i = 0, S0 - 1 do r.c[i] = struct.unpack('<i8', rec, HDRLEN + 8 * i + 1) end
    r.same = true
    return r
  end
  -- A new length: every count the ring held moves to the new bucket
  -- holding the last microsecond of the furthest old bucket, so none
  -- expires earlier; the ring's head may then run ahead of now's bucket
  -- (claims are dated from the head).
  r.B = B; r.F = math.floor(B / 4); r.S = B + 1 + r.F
  for i = 0, r.S - 1 do r.c[i] = 0 end
  local nb = bucketOf(r.t, B, T)
  local k = bucketOf(bucketStart(head + F0 + 1, B0, T0) - 1, B, T)
  r.head = math.max(nb, k - r.F)
  r.total = 0
  if k >= nb - B then
    r.c[k % r.S] = total; r.total = total
  end
  return r
end

-- advance brings r's head to now's bucket: buckets that left the
-- window are emptied (their slots are the new future buckets').
local function advance(r)
  local nb = bucketOf(r.t, r.B, r.T)
  if nb <= r.head then return end
  if nb - r.head >= r.S then
    for i = 0, r.S - 1 do r.c[i] = 0 end
    r.total = 0
  else
    for j = r.head - r.B, nb - r.B - 1 do
      local s = j % r.S
      r.total = r.total - r.c[s]; r.c[s] = 0
    end
  end
  r.head = nb
end

-- retryOf returns when r has room for need more units: walking from the
-- oldest bucket held, the expiry of the one that frees enough.
local function retryOf(r, excess)
  local acc = 0
  for j = r.head - r.B, r.head + r.F do
    acc = acc + r.c[j % r.S]
    if acc >= excess then return bucketStart(j + r.B + 1, r.B, r.T) - r.t end
  end
  return 0
end

local rings, refuse, look = {}, false, false
for k = 1, nk do
  local a = 1 + 9 * (k - 1)
  local N, T, B = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local want, need = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local r = load(KEYS[k], T, B)
  if r == nil then return {-1} end
  advance(r)
  local back, bk = tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7])
  if back > 0 and r.same and tonumber(ARGV[a + 8]) == T and tonumber(ARGV[a + 9]) == r.B
      and bk >= r.head - r.B and bk <= r.head + r.F then
    local s = bk % r.S
    local d = math.min(back, r.c[s])
    r.c[s] = r.c[s] - d; r.total = r.total - d
  end
  r.N, r.want, r.need = N, want, need
  if want < 0 then look = true end
  if r.total + need > N then refuse = true end
  rings[k] = r
end

local out = {}
for k = 1, nk do
  local r = rings[k]
  local g, dated = 0, r.head
  if not refuse and not look then
    local room = r.N - r.total
    g = math.max(r.need, math.min(r.want, math.floor(room / 4)))
    if room - g >= r.N / 4 then dated = r.head + r.F end
    local s = dated % r.S
    r.c[s] = r.c[s] + g; r.total = r.total + g
  end
  local retry = 0
  if (refuse or look) and r.total + r.need > r.N then
    retry = retryOf(r, r.total + r.need - r.N)
  elseif r.total > 0 then
    retry = retryOf(r, 1)
  end
  if not look and not (r.fresh and r.total == 0) then
    local parts = {struct.pack(HDR, r.head, r.t, r.T, r.total, r.B, r.F)}
    for i = 0, r.S - 1 do parts[i + 2] = struct.pack('<i8', r.c[i]) end
    local ttl = bucketStart(r.head + r.F + r.B + 1, r.B, r.T) - r.t
    redis.call('SET', r.key, table.concat(parts), 'PX', math.max(math.floor(ttl / 1000) + 1, 10000))
  end
  local o = 7 * (k - 1)
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = g, dated, bucketStart(dated + 1, r.B, r.T), r.t
  out[o + 5], out[o + 6], out[o + 7] = r.total, retry, r.B
end
if #KEYS > nk then
  out[7 * nk + 1] = redis.call('EXISTS', KEYS[nk + 1])
end
return out
`

var grantScript = redis.NewScript(bucketMathLua + grantMainLua)
