-- A run's authority lock: take it (with the head and state it guards), extend it, drop it.
-- KEYS[1] lock, KEYS[2] run hash; ARGV[1] 'acquire' | 'extend' | 'release', ARGV[2] token,
-- ARGV[3] time to live (ms)
local lock, op, token = KEYS[1], ARGV[1], ARGV[2]
if op == 'acquire' then
  if redis.call('EXISTS', KEYS[2]) == 0 then return {'unknown'} end
  -- (held with this token: a resend of this acquire after its reply was lost)
  if redis.call('GET', lock) ~= token and not redis.call('SET', lock, token, 'NX', 'PX', ARGV[3]) then
    return {'busy', tostring(redis.call('PTTL', lock))}
  end
  local v = redis.call('HMGET', KEYS[2], 'head', 'state')
  return {'ok', v[1], v[2]}
end
if redis.call('GET', lock) ~= token then return {'lost'} end
if op == 'extend' then
  redis.call('PEXPIRE', lock, ARGV[3])
else
  redis.call('DEL', lock)
end
return {'ok'}
