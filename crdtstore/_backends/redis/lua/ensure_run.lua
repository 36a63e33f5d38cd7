-- Return a run, creating it if asked (created: this server's clock).
-- KEYS[1] the tenant's runs (sorted set, by creation), KEYS[2] run hash, KEYS[3] parent hash
-- ARGV[1] run, ARGV[2] parent ('' none), ARGV[3] '1' to create
local runs, meta, pmeta = KEYS[1], KEYS[2], KEYS[3]
local run, parent = ARGV[1], ARGV[2]
local function row()
  local v = redis.call('HMGET', meta, 'created', 'head', 'snap', 'parent', 'state', 'delete_after')
  for i = 1, 6 do
    if not v[i] then v[i] = '' end
  end
  return {'ok', v[1], v[2], v[3], v[4], v[5], v[6]}
end
if redis.call('EXISTS', meta) == 1 then
  local have = redis.call('HGET', meta, 'parent') or ''
  if parent ~= '' and have ~= parent then return {'parent', have} end
  return row()
end
if ARGV[3] ~= '1' then return {'unknown', run} end
if parent ~= '' and redis.call('EXISTS', pmeta) == 0 then return {'unknown', parent} end
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('HSET', meta, 'created', string.format('%.17g', us / 1000000), 'head', '0',
  'snap', '0', 'state', 'open', 'config', '{}')
if parent ~= '' then redis.call('HSET', meta, 'parent', parent) end
redis.call('ZADD', runs, string.format('%d', us), run)
return row()
