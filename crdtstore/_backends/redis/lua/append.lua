-- Append entries to a run's journal at the next dense positions, atomically.
-- KEYS[1] run hash, KEYS[2] journal stream, KEYS[3] key index, KEYS[4] authority lock
-- ARGV[1] lock token ('' for a plain append), ARGV[2] expected head ('' for any), ARGV[3] n,
-- then per entry: agent, source, client id, wall time, update, effect, crc, origin, call,
-- k, and k index prefixes ("collection NUL key NUL").
-- A plain append is refused while another writer holds the run's authority lock; an
-- authority's commit only while it still holds it, on the head it read.
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
local at = 4
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
