package cluster

import "github.com/redis/go-redis/v9"

// The scripts of owner mode (Owner; docs/design.md, "Decisions where
// the device is"). A device's record is the hash o:{device}: g the
// owning gateway, e the fencing epoch, c the owner's last checkpoint
// of the device's windows (checkpoint.go), lm and lb the lease (messages
// and bytes the owner may admit beyond c), w 1 while a claimant waits
// for the previous owner pg (at its epoch pe) to release the device.
// Each script touches one device's key: on Redis Cluster it runs on
// the device's slot.

// Every script runs over many devices: KEYS are their records, ARGV
// the arguments common to all, then those of each key in turn; it
// returns one reply per key (Owner.many: one call where one Redis server
// holds them all, one call per key on Redis Cluster).

// claimLua makes ARGV[1] the owner of each device KEYS[i] under a new
// epoch. Each reply is {wait, epoch, c, lm, lb, prev}: wait 0 when the
// device is the claimant's at once (no owner, or itself: the claimant
// charges lm and lb); 1 when prev, another gateway, may still decide
// for it: the claimant checks prev's liveness (a key of its own, in
// another slot on Redis Cluster), asks it to release the device when
// it lives, and settles. A claim that finds an earlier claimant that
// never settled (w 1) waits for the owner that one waited for.
const claimLua = `
local out = {}
for i = 1, #KEYS do
  local r = redis.call('HMGET', KEYS[i], 'g', 'e', 'c', 'lm', 'lb', 'w', 'pg', 'pe')
  local g, e = r[1], tonumber(r[2] or '0')
  local ne = e + 1
  local prev, pe = '', 0
  if r[6] == '1' and r[7] and r[7] ~= ARGV[1] then
    prev, pe = r[7], tonumber(r[8])
  elseif g and g ~= ARGV[1] then
    prev, pe = g, e
  end
  if prev ~= '' then
    redis.call('HSET', KEYS[i], 'g', ARGV[1], 'e', ne, 'w', 1, 'pg', prev, 'pe', pe)
    out[i] = {1, ne, '', 0, 0, prev}
  else
    redis.call('HSET', KEYS[i], 'g', ARGV[1], 'e', ne, 'w', 0)
    out[i] = {0, ne, r[3] or '', tonumber(r[4] or '0'), tonumber(r[5] or '0'), ''}
  end
end
return out
`

// settleLua ends the wait of claimant ARGV[1] at epoch ARGV[1+i] of
// each device: the previous owner released it (lm and lb 0) or is taken
// as gone (its lease to charge). Each reply is {1, c, lm, lb}, or {0}
// when another gateway claimed the device meanwhile.
const settleLua = `
local out = {}
for i = 1, #KEYS do
  local r = redis.call('HMGET', KEYS[i], 'g', 'e', 'c', 'lm', 'lb')
  if r[1] ~= ARGV[1] or r[2] ~= ARGV[1 + i] then
    out[i] = {0}
  else
    redis.call('HSET', KEYS[i], 'w', 0)
    out[i] = {1, r[3] or '', tonumber(r[4] or '0'), tonumber(r[5] or '0')}
  end
end
return out
`

// releaseLua writes gateway ARGV[2]'s final checkpoint of each device it
// owned, with no lease: per key the epoch and the checkpoint. A write is
// accepted while a claimant waits for this gateway (w 1, pg and pe its
// own), or while it still owns the device (a voluntary release). ARGV[1]
// is the prefix: the waiting claimant is told on its channel. Each reply
// is 1 when written, else 0.
const releaseLua = `
local out = {}
for i = 1, #KEYS do
  local a = 2 + 2 * (i - 1)
  local r = redis.call('HMGET', KEYS[i], 'g', 'e', 'w', 'pg', 'pe')
  out[i] = 0
  if r[3] == '1' and r[4] == ARGV[2] and r[5] == ARGV[a + 1] then
    redis.call('HSET', KEYS[i], 'c', ARGV[a + 2], 'lm', 0, 'lb', 0, 'w', 0)
    redis.call('PUBLISH', ARGV[1] .. 'gwc:' .. r[1], 'r' .. string.sub(KEYS[i], #ARGV[1] + 4, -2))
    out[i] = 1
  elseif r[1] == ARGV[2] and r[2] == ARGV[a + 1] then
    redis.call('HSET', KEYS[i], 'c', ARGV[a + 2], 'lm', 0, 'lb', 0)
    out[i] = 1
  end
end
return out
`

// checkpointLua writes owner ARGV[1]'s checkpoints, per key the epoch,
// checkpoint, lm and lb. A device's is written while the owner and
// epoch are still the record's, or when the record is gone (Redis lost
// its data: the owner writes it anew); else refused (fenced). Each reply
// is 1 (written) or 0.
const checkpointLua = `
local out = {}
for i = 1, #KEYS do
  local a = 1 + 4 * (i - 1)
  local r = redis.call('HMGET', KEYS[i], 'g', 'e')
  if (r[1] == ARGV[1] and r[2] == ARGV[a + 1]) or (not r[1] and not r[2]) then
    redis.call('HSET', KEYS[i], 'g', ARGV[1], 'e', ARGV[a + 1], 'c', ARGV[a + 2], 'lm', ARGV[a + 3], 'lb', ARGV[a + 4])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
`

var (
	claimScript      = redis.NewScript(claimLua)
	settleScript     = redis.NewScript(settleLua)
	releaseScript    = redis.NewScript(releaseLua)
	checkpointScript = redis.NewScript(checkpointLua)
)
