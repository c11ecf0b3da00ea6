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

// claimLua makes ARGV[1] the owner of the device KEYS[1] under a new
// epoch. It returns {wait, epoch, c, lm, lb, prev}: wait 0 when the
// device is the claimant's at once (no owner, or itself: the claimant
// charges lm and lb); 1 when prev, another gateway, may still decide
// for it: the claimant checks prev's liveness (a key of its own, in
// another slot on Redis Cluster), asks it to release the device when
// it lives, and settles. A claim that finds an earlier claimant that
// never settled (w 1) waits for the owner that one waited for.
const claimLua = `
local r = redis.call('HMGET', KEYS[1], 'g', 'e', 'c', 'lm', 'lb', 'w', 'pg', 'pe')
local g, e = r[1], tonumber(r[2] or '0')
local ne = e + 1
local prev, pe = '', 0
if r[6] == '1' and r[7] and r[7] ~= ARGV[1] then
  prev, pe = r[7], tonumber(r[8])
elseif g and g ~= ARGV[1] then
  prev, pe = g, e
end
if prev ~= '' then
  redis.call('HSET', KEYS[1], 'g', ARGV[1], 'e', ne, 'w', 1, 'pg', prev, 'pe', pe)
  return {1, ne, '', 0, 0, prev}
end
redis.call('HSET', KEYS[1], 'g', ARGV[1], 'e', ne, 'w', 0)
return {0, ne, r[3] or '', tonumber(r[4] or '0'), tonumber(r[5] or '0'), ''}
`

// settleLua ends the wait of claimant ARGV[1] at epoch ARGV[2]: the
// previous owner released the device (lm and lb 0) or is taken as gone
// (its lease to charge). It returns {1, c, lm, lb}, or {0} when another
// gateway claimed the device meanwhile.
const settleLua = `
local r = redis.call('HMGET', KEYS[1], 'g', 'e', 'c', 'lm', 'lb')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] then return {0} end
redis.call('HSET', KEYS[1], 'w', 0)
return {1, r[3] or '', tonumber(r[4] or '0'), tonumber(r[5] or '0')}
`

// releaseLua writes gateway ARGV[1]'s final checkpoint ARGV[3] of the
// device it owned at epoch ARGV[2], with no lease: accepted while a
// claimant waits for it (w 1, pg and pe its own), or while it still
// owns the device (a voluntary release). ARGV[4] is the prefix: the
// waiting claimant is told on its channel. It returns 1 when written.
const releaseLua = `
local r = redis.call('HMGET', KEYS[1], 'g', 'e', 'w', 'pg', 'pe')
if r[3] == '1' and r[4] == ARGV[1] and r[5] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'c', ARGV[3], 'lm', 0, 'lb', 0, 'w', 0)
  redis.call('PUBLISH', ARGV[4] .. 'gwc:' .. r[1], 'r' .. string.sub(KEYS[1], #ARGV[4] + 4, -2))
  return 1
end
if r[1] == ARGV[1] and r[2] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'c', ARGV[3], 'lm', 0, 'lb', 0)
  return 1
end
return 0
`

// checkpointLua writes the checkpoints of many devices, five ARGV per
// key: owner, epoch, checkpoint, lm, lb. A device's is written while
// the owner and epoch are still the record's, or when the record is
// gone (Redis lost its data: the owner writes it anew); else refused
// (fenced). It returns 1 (written) or 0 per key.
const checkpointLua = `
local out = {}
for i = 1, #KEYS do
  local a = 5 * (i - 1)
  local r = redis.call('HMGET', KEYS[i], 'g', 'e')
  if (r[1] == ARGV[a + 1] and r[2] == ARGV[a + 2]) or (not r[1] and not r[2]) then
    redis.call('HSET', KEYS[i], 'g', ARGV[a + 1], 'e', ARGV[a + 2], 'c', ARGV[a + 3], 'lm', ARGV[a + 4], 'lb', ARGV[a + 5])
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
