-- Append entries to a run's journal at the next dense positions, atomically.
-- KEYS[1] run hash, KEYS[2] journal stream, KEYS[3] key index, KEYS[4] authority lock,
-- KEYS[5] the tenant's lease requests (one of them read by a fenced append)
-- ARGV[1] lock token ('' for a plain append), ARGV[2] expected head ('' for any), ARGV[3] n,
-- ARGV[4] guard ('' none; JSON {seen, keys: [[collection, key]...], scopes: [...], fence:
-- [lease id, token, resource, now ('' = this server's TIME), clock boot]}), then per entry:
-- agent, source, client id, wall time, update, effect, crc, origin, call, k, and k index
-- prefixes ("collection NUL key NUL").
-- A plain append is refused while another writer holds the run's authority lock; an
-- authority's commit only while it still holds it, on the head it read. A guarded append
-- ('stale') when an entry after `seen` touches a guarded key or scope, or was compacted
-- away; ('fence') when the lease is not granted, does not cover the resource, holds another
-- token or has expired: the check and the append are this one step.
local meta, stream, index, lock = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, expect, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local state = redis.call('HGET', meta, 'state')
if not state then return {'unknown'} end
local holder = redis.call('GET', lock)
if token == '' then
  if holder then return {'locked'} end
elseif holder ~= token then
  return {'lost'}
end
if state ~= 'open' then return {'closed', state} end
local head = tonumber(redis.call('HGET', meta, 'head'))
if expect ~= '' and head ~= tonumber(expect) then return {'moved', tostring(head)} end

if ARGV[4] ~= '' then
  local g = cjson.decode(ARGV[4])
  local seen = tonumber(g.seen)
  if head > seen then
    local all = false
    for _, s in ipairs(g.scopes) do
      if s == '*' then all = true end
    end
    if all then return {'stale', tostring(head)} end
    local rows = redis.call('XRANGE', stream, '(' .. string.format('%d', seen) .. '-0', '+')
    if #rows ~= head - seen then return {'stale', tostring(head)} end -- compacted away
    local keys, scopes = {}, {}
    for _, kv in ipairs(g.keys) do keys[kv[1] .. '\0' .. kv[2]] = true end
    for _, s in ipairs(g.scopes) do scopes[s] = true end
    for _, e in ipairs(rows) do
      local f, effect = e[2], nil
      for j = 1, #f, 2 do
        if f[j] == 'e' then effect = f[j + 1] end
      end
      if not effect or effect == '' or effect == '[]' then return {'stale', tostring(head)} end
      for _, op in ipairs(cjson.decode(effect)) do
        if scopes[op[2]] then return {'stale', tostring(head)} end
        if op[1] == 'map' and keys[tostring(op[2]) .. '\0' .. tostring(op[4])] then
          return {'stale', tostring(head)}
        end
      end
    end
  end
  local fence = g.fence
  if fence and fence ~= cjson.null then
    local now, boot
    if fence[4] == '' then
      local t = redis.call('TIME')
      now, boot = tonumber(t[1]) + tonumber(t[2]) / 1000000, 'redis'
    else
      now, boot = tonumber(fence[4]), fence[5]
    end
    local ok = false
    local raw = redis.call('HGET', KEYS[5], fence[1])
    if raw then
      -- the request layout of lease.lua: [6] resources, [7] state, [8] token, [16] clock
      -- boot, [19] expires
      local a = cjson.decode(raw)
      if a[7] == 'granted' and tonumber(a[8]) == tonumber(fence[2]) and a[16] == boot
          and tonumber(a[19]) > now then
        for _, x in ipairs(a[6]) do
          if x == fence[3] then ok = true end
        end
      end
    end
    if not ok then return {'fence'} end
  end
end

local at = 5
for i = 1, n do
  local seq = head + i
  local pos = string.format('%d', seq)
  local k = tonumber(ARGV[at + 9])
  local members = {}
  for j = 1, k do members[j] = ARGV[at + 9 + j] .. string.format('%020d', seq) end
  redis.call('XADD', stream, pos .. '-0',
    'a', ARGV[at], 's', ARGV[at + 1], 'c', ARGV[at + 2], 'w', ARGV[at + 3],
    'u', ARGV[at + 4], 'e', ARGV[at + 5], 'k', ARGV[at + 6], 'o', ARGV[at + 7],
    'l', ARGV[at + 8], 'x', table.concat(members, '\0\0'))
  for j = 1, k do redis.call('ZADD', index, 0, members[j]) end
  at = at + 10 + k
end
redis.call('HSET', meta, 'head', string.format('%d', head + n))
if token ~= '' then redis.call('DEL', lock) end
return {'ok', string.format('%d', head + 1)}
