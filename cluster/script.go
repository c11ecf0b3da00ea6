package cluster

import "github.com/redis/go-redis/v9"

// windowLua decides on devices' shared windows, the same
// ring-array sliding window as devicelimit's (see devicelimit/window.go
// for the invariant and its proof), run atomically inside Redis.
//
// KEYS are the windows of one or more decisions; ARGV has six values
// per key: limit, window length T in microseconds, bucket count B (of a
// window made afresh: an existing one keeps its own until it expires),
// "1" to count (AllowAt) or "0" to look (Peek), the units the message
// counts in the window (1 in a message window, its payload bytes in a
// byte window), and a group value: consecutive keys with the same group
// are the windows of one message, admitted only when every one admits
// it and then counted in each (a refused message counts in none); a
// negative group value is decided only when the group before it
// admitted its message (a device's windows and its group's of which one
// is in shadow mode: devicelimit.Table.AllowGroupAt). Then comes an explicit time in microseconds that only tests pass, empty in
// production, where the clock is Redis's TIME (read once per call). It
// returns four integers per key: allowed 0|1 (1: the message was counted
// in every window of its group), count, remaining, retry-after in
// microseconds (0 when this window admits); allowed is -1 when the key
// holds something else than a record of this layout (another type,
// another version's record): that key is left as it is, nothing of its
// group is counted, and the other groups of the call are decided all
// the same (a script error would end the call half done, with the
// earlier groups' admissions counted). Several decisions in one call
// save the script's fixed costs; on Redis Cluster, where one call's keys
// must share a slot, each decision is a call of its own (a device's
// windows share its hash tag).
//
// Time is in microseconds since the Unix epoch, about 1.8e15 today:
// Lua numbers are doubles, exact below 2^53 (9.0e15), and every product
// below stays under that bound (t*B would not, so floor(t*B/T) is taken
// as q*B + floor(r*B/T) with t = q*T + r). Bucket k covers the
// microseconds t with floor(t*B/T) = k, devicelimit's boundaries when T
// is a whole number of microseconds.
//
// The record is one string: head bucket, clock high-water, T and the
// instant the window admits again after a refusal under the recorded
// limit (0 when not full), int64 each; total and that limit (uint32), B
// (uint16), the counter width W (1, 2 or 4 bytes, as the largest limit
// or count held needs); then B+1 counters of W bytes: 43 + W(B+1)
// bytes, 64 for 20 buckets and limits under 256. A refusal before that instant
// reads only the header and writes nothing; its Count is the window's
// count when it was last written, at least the limit (the exact count
// needs the ring, which is the costly part of the script). The high-water
// is the latest time the window was decided at; a decision never runs
// earlier, so a Redis clock stepped back cannot empty a window. The key
// expires when its newest bucket leaves the window, and no sooner than
// ten seconds after it was written: idle devices cost nothing.
const windowLua = windowFuncsLua + windowMainLua

// windowFuncsLua reads the clock and defines the window functions.
const windowFuncsLua = windowClockLua + bucketMathLua + windowRingLua

// windowClockLua reads the clock: the explicit time after the keys'
// arguments (tests), else Redis's TIME.
const windowClockLua = `
local nk = #KEYS
local clock
if ARGV[6 * nk + 1] ~= nil and ARGV[6 * nk + 1] ~= '' then
  clock = tonumber(ARGV[6 * nk + 1])
else
  local t = redis.call('TIME')
  clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

`

// bucketMathLua is the bucket arithmetic the window and grant scripts
// share (grantscript.go).
const bucketMathLua = `
-- divmod returns floor(a/b) and a - floor(a/b)*b exactly for integers
-- a >= 0, b > 0 below 2^53: the double division may round across an
-- integer, which the remainder's sign corrects.
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1; r = r + b
  elseif r >= b then
    q = q + 1; r = r - b
  end
  return q, r
end

-- bucketOf returns floor(t*b/w).
local function bucketOf(t, b, w)
  if t <= 0 then return 0 end
  local q, r = divmod(t, w)
  local q2 = divmod(r * b, w)
  return q * b + q2
end

-- bucketStart returns ceil(k*w/b), the first microsecond of bucket k.
local function bucketStart(k, b, w)
  if k <= 0 then return 0 end
  local q, c = divmod(k, b)
  local f, r = divmod(c * w, b)
  if r > 0 then f = f + 1 end
  return q * w + f
end

`

// windowRingLua defines the ring functions of windowLua.
const windowRingLua = `
local HDR = '<i8i8i8i8I4I4I2B'
local HDRLEN = 43
-- The counts stay a string: slot i is the W bytes at W*i+1. Reading and
-- rewriting a few slots costs less than a Lua table of them all. W is
-- 1, 2 or 4 bytes, as the largest limit or count the window has held
-- needs. body, W and F are the window at hand's (use).
local body, W, F
local FMT = {[1] = '<B', [2] = '<H', [4] = '<I4'}
local function getc(i) return (struct.unpack(F, body, W * i + 1)) end
local function setc(i, v) body = string.sub(body, 1, W * i) .. struct.pack(F, v) .. string.sub(body, W * i + W + 1) end
local function widthFor(n)
  if n < 256 then return 1 elseif n < 65536 then return 2 end
  return 4
end
local function setWidth(w) W = w; F = FMT[w] end
local function use(st) body = st.body; setWidth(st.W) end

-- prepare reads the window at key and brings it to now: re-cut for a
-- new length, counters widened for a larger limit, expired buckets
-- emptied; nothing is written yet. It returns the window's state, or
-- nil when the key holds something this script does not know. A
-- window refused before the instant it recorded is st.full, read from
-- the header alone.
local function prepare(key, limit, T, B, units, now)
  local S = B + 1
  local rec = redis.pcall('GET', key)
  local head, hw, len, nb0, total, ulimit, untilT, w
  if type(rec) == 'table' then
    return nil -- not a string: another program's key
  end
  if rec then
    if #rec < HDRLEN then return nil end
    head, hw, len, untilT, total, ulimit, nb0, w = struct.unpack(HDR, rec)
    if FMT[w] == nil or nb0 < 1 or len < 1 or #rec ~= HDRLEN + w * (nb0 + 1) then
      return nil -- a layout this script does not know
    end
    -- The window keeps the bucket count it was made with until it
    -- expires: gateways whose bucket counts differ (a rolling change)
    -- share it as it is instead of re-cutting it at every turn.
    B = nb0
    S = B + 1
    if hw > now then now = hw end
    if units == 1 and now < untilT and ulimit == limit and len == T then
      -- Still full: nothing expires before untilT, refusals add nothing.
      -- (untilT is recorded for a message counting 1 only.)
      return {full = true, total = total, retry = untilT - now, units = units, limit = limit}
    end
    if len ~= T then
      -- Re-cut for a new length: each old bucket's count moves to the
      -- new bucket holding the old bucket's last microsecond, so it
      -- expires no earlier than before, and at most a new bucket later.
      -- The old newest bucket may reach past now's: the ring then ends
      -- there, and counts between now's window and the ring's go to its
      -- oldest bucket; counts wholly before now's window go. (Moving all
      -- of them into the newest bucket, as devicelimit's re-cut once did,
      -- kept them from ever expiring while gateways that disagree on
      -- the length took turns.)
      body = string.sub(rec, HDRLEN + 1)
      setWidth(w)
      local old = {}
      for i = 0, S - 1 do old[i] = getc(i) end
      local nb = bucketOf(now, B, T)
      local newHead = math.max(nb, bucketOf(bucketStart(head + 1, B, len) - 1, B, T))
      setWidth(math.max(w, widthFor(limit), widthFor(total)))
      body = string.rep('\0', W * S)
      local kept = 0
      for j = 0, B do
        local k = head - j
        local c = old[k % S]
        if c > 0 then
          local k2 = bucketOf(bucketStart(k + 1, B, len) - 1, B, T)
          if k2 >= nb - B then
            if k2 < newHead - B then k2 = newHead - B end
            setc(k2 % S, getc(k2 % S) + c)
            kept = kept + c
          end
        end
      end
      head = newHead
      total = kept
    else
      body = string.sub(rec, HDRLEN + 1)
      setWidth(w)
      local need = widthFor(limit)
      if need > w then
        -- Widen the counters for a larger limit.
        local old = {}
        for i = 0, S - 1 do old[i] = getc(i) end
        setWidth(need)
        body = string.rep('\0', W * S)
        for i = 0, S - 1 do
          if old[i] > 0 then setc(i, old[i]) end
        end
      end
    end
  else
    head = bucketOf(now, B, T)
    hw = now
    total = 0
    setWidth(widthFor(limit))
    body = string.rep('\0', W * S)
  end
  if hw > now then now = hw end

  local nb = bucketOf(now, B, T)
  if nb < head then
    -- Only after a re-cut into a later bucket: decide as of the head,
    -- with RetryAfter and the expiry still counted from now.
    nb = head
  elseif nb > head then
    local gap = nb - head
    if gap >= S then
      body = string.rep('\0', W * S)
      total = 0
    else
      local slot = head % S
      for _ = 1, gap do
        slot = slot + 1
        if slot == S then slot = 0 end
        local c = getc(slot)
        if c > 0 then
          total = total - c
          setc(slot, 0)
        end
      end
    end
    head = nb
  end
  -- One constructor: the table is made at its size once.
  return {key = key, limit = limit, T = T, units = units, head = head, now = now, total = total, B = B, S = S, body = body, W = W}
end

-- store writes the window back (use(st) done). The key outlives its
-- newest bucket by at least ten seconds of Redis's real time: 'now' is
-- the caller's clock, and a window of a few milliseconds must not vanish
-- while a slow caller is still deciding in it (a key kept longer is
-- judged by its bucket times all the same). One second was too little:
-- a gateway stalled over a second between two decisions of one device
-- (the race detector at load 20) found the window gone and admitted
-- what it had refused.
local function store(st, untilT)
  local ttl = bucketStart(st.head + st.S, st.B, st.T) - st.now
  local ms = math.max(math.floor(ttl / 1000) + 1, 10000)
  redis.call('SET', st.key, struct.pack(HDR, st.head, st.now, st.T, untilT, st.total, st.limit, st.B, W) .. body, 'PX', ms)
end

-- retryOf returns the instant the window admits a message counting
-- units again: when the oldest bucket whose expiry leaves room for it
-- leaves, walking from the oldest slot (the one after the newest).
local function retryOf(st)
  local S = st.S
  local excess = st.total + st.units - st.limit - 1
  local oldest = st.head % S + 1
  if oldest == S then oldest = 0 end
  local prefix, pos = 0, 0
  for i = 0, S - 1 do
    local s = oldest + i
    if s >= S then s = s - S end
    prefix = prefix + getc(s)
    if prefix > excess then pos = i; break end
  end
  return bucketStart(st.head - st.B + pos + S, st.B, st.T)
end

`

// windowMainLua is windowLua's main part, after the functions it
// shares with standingLua (standing.go).
const windowMainLua = `
-- One decision is a run of keys with the same group value: the windows
-- of one message, which counts in all of them or in none. A negative
-- group value is conditional: its run is decided only when the run
-- before it admitted (a device's enforced windows before its group's in
-- shadow mode, or the reverse); when not, its keys are left as they
-- are and answer 0, 0, 0, 0.
local out = {}
local i = 1
local prevOK = true
while i <= nk do
  local g = ARGV[6 * i]
  local j = i
  while j < nk and ARGV[6 * j + 6] == g do j = j + 1 end
  if tonumber(g) < 0 and not prevOK then
    for k = i, j do
      local a = 4 * k
      out[a - 3], out[a - 2], out[a - 1], out[a] = 0, 0, 0, 0
    end
  else
    local count = ARGV[6 * i - 2] == '1'
    local sts, ok = {}, true
    for k = i, j do
      local a = 6 * k
      local units = tonumber(ARGV[a - 1])
      local st = prepare(KEYS[k], tonumber(ARGV[a - 5]), tonumber(ARGV[a - 4]), tonumber(ARGV[a - 3]), units, clock)
      sts[k] = st
      if st == nil or st.full or st.total + units > st.limit then ok = false end
    end
    for k = i, j do
      local st, a = sts[k], 4 * k
      if st == nil then
        out[a - 3], out[a - 2], out[a - 1], out[a] = -1, 0, 0, 0
      elseif st.full then
        out[a - 3], out[a - 2], out[a - 1], out[a] = 0, st.total, 0, st.retry
      elseif st.units > st.limit then
        -- Never admitted (the caller says so without asking): nothing read.
        out[a - 3], out[a - 2], out[a - 1], out[a] = 0, 0, st.limit, 0
      elseif st.total + st.units <= st.limit then
        -- Admitted here: counted when every window admits.
        local allowed = 0
        if ok and count then
          use(st)
          local slot = st.head % st.S
          setc(slot, getc(slot) + st.units)
          st.total = st.total + st.units
          store(st, 0)
          allowed = 1
        end
        out[a - 3], out[a - 2], out[a - 1], out[a] = allowed, st.total, st.limit - st.total, 0
      else
        use(st)
        local untilT = retryOf(st)
        if count then
          -- The instant is kept for a message counting 1: a smaller one
          -- may fit earlier.
          if st.units == 1 then store(st, untilT) else store(st, 0) end
        end
        out[a - 3], out[a - 2], out[a - 1], out[a] = 0, st.total, 0, untilT - st.now
      end
    end
    prevOK = ok
  end
  i = j + 1
end
return out
`

var windowScript = redis.NewScript(windowLua)
